#include "core/device_context.hpp"

#include <algorithm>
#include <cerrno>
#include <limits>

#include "ferry/error.hpp"

namespace ferry::detail {

namespace {
// Below this inject size fragments would be too small to beat one transport send.
constexpr std::size_t kMinFragmentInject = 1024;
}  // namespace

void add_chunks(std::vector<Chunk>& out, void* owner, CtxKind kind, unsigned char* local, void* desc,
                std::size_t size, std::uint64_t addr, std::uint64_t key, std::size_t max) {
  for (std::size_t off = 0; off < size; off += max) {
    Chunk c{};
    c.ctx.set_kind(kind);
    c.owner = owner;
    c.local = local + off;
    c.desc = desc;
    c.size = size - off < max ? size - off : max;
    c.remote_addr = addr + off;
    c.key = key;
    out.push_back(c);
  }
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_transport(const Link& link, const char* call, int rc, int rank) {
  throw Error(net::error_text(call, rc) + " to rank " + std::to_string(rank) + " over " + link.caps->name);
}

DeviceContext::DeviceContext(const DeviceParts& parts, int index, const Config& config,
                             std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route)
    : targets_(parts.targets),
      failures_(parts.failures),
      barrier_(parts.barrier),
      failed_(parts.failures.failed_table()),
      index_(index),
      rank_(parts.rank),
      size_(parts.size),
      config_(config),
      pool_(std::make_unique<PacketPool>(config.packets, config.packet_size)),
      transports_(std::move(transports)),
      eager_limit_(config.packet_size - kHeader) {
  if (config.rdv_threshold != 0 && config.rdv_threshold < eager_limit_) eager_limit_ = config.rdv_threshold;
  std::size_t send_queue = 0;
  for (const auto& t : transports_) {
    const net::Caps& caps = t->caps();
    if (eager_limit_ > caps.max_msg_size - kHeader) eager_limit_ = caps.max_msg_size - kHeader;
    if (caps.send_queue != 0) send_queue = send_queue == 0 ? caps.send_queue : std::min(send_queue, caps.send_queue);
  }
  // Each transport keeps FERRY_PREPOST receives from the one pool (posted, or for a lending
  // transport at most kPollBatch spare packets), and a send needs a packet too: receives that
  // held every packet would leave the first send waiting forever.
  const std::size_t links = transports_.size();
  if (links > 0 && config.prepost > (config.packets - 1) / links) {
    throw Error("FERRY_PACKETS=" + std::to_string(config.packets) + " leaves no packet to send with FERRY_PREPOST=" +
                std::to_string(config.prepost) + " receives posted on each of the device's " + std::to_string(links) +
                " transport(s); set FERRY_PACKETS to at least " + std::to_string(config.prepost * links + 1) +
                " or FERRY_PREPOST to at most " + std::to_string((config.packets - 1) / links));
  }
  credits_max_ = config.send_credits != 0 ? config.send_credits : (send_queue != 0 ? send_queue : 256);
  credits_.store(static_cast<std::int64_t>(credits_max_), std::memory_order_relaxed);
  links_.reserve(transports_.size());
  for (const auto& t : transports_) {
    const net::Caps& caps = t->caps();
    Link l{t.get(), caps.inject_size, caps.gather_inject ? caps.inject_size : 0, &caps, nullptr, nullptr, 0, 0, 0};
    l.whole_frame = std::min(caps.inject_size, config.packet_size);
    // The packet slab is registered once per transport; the desc matters only under local_registration.
    l.pool_registration = t->register_memory(pool_->slab(), pool_->slab_bytes(), net::Access::send | net::Access::recv);
    l.pool_desc = caps.local_registration ? l.pool_registration->desc() : nullptr;
    l.lends = caps.receives == net::Receives::lent;
    links_.push_back(l);
  }
  plan_fragments();
  route_.resize(route.size(), nullptr);
  for (std::size_t r = 0; r < route.size(); ++r) route_[r] = &links_[static_cast<std::size_t>(route[r])];
}

void DeviceContext::plan_fragments() {
  // Fragments carry messages up to FERRY_FRAGMENT_MAX (or the packet's eager limit, if larger),
  // never past an explicit rendezvous threshold; 32-bit offsets on the wire.
  std::size_t limit = std::max(eager_limit_, config_.fragment_max);
  if (config_.rdv_threshold != 0) limit = std::min(limit, config_.rdv_threshold);
  limit = std::min<std::size_t>(limit, std::numeric_limits<std::uint32_t>::max());
  fragment_limit_ = 0;
  for (Link& l : links_) {
    const net::Caps& caps = *l.caps;
    l.fragment_payload = 0;
    l.fragment_limit = 0;
    const bool wanted = config_.fragment == FragmentMode::on ||
                        (config_.fragment == FragmentMode::automatic && !caps.one_copy_get);
    // A fragment lands in one of the peer's posted receive packets, so no frame is larger than
    // a packet (FERRY_PACKET_SIZE below the inject size would otherwise truncate every one).
    const std::size_t frame = std::min(
        caps.gather_inject ? caps.inject_size : std::min(caps.inject_size, kMaxFragmentFrame), config_.packet_size);
    if (wanted && frame >= kMinFragmentInject && kHeader + limit > l.whole_frame) {
      l.fragment_payload = frame - kFragmentHeader;
      l.fragment_limit = limit;
      fragment_limit_ = std::max(fragment_limit_, limit);
    }
  }
  // A message is eager (sent at once, complete on return) only if it is eager on every link:
  // a caller that reuses its buffer at once must not meet a rendezvous on one of them.
  eager_everywhere_ = std::numeric_limits<std::size_t>::max();
  for (const Link& l : links_) eager_everywhere_ = std::min(eager_everywhere_, std::max(eager_limit_, l.fragment_limit));
}

DeviceContext::~DeviceContext() {
  // Endpoints close before the packet pool's registration goes: a send to a failed peer may
  // still be queued in the backend, and closing the endpoint may touch it.
  for (Link& l : links_) l.transport->close();
  for (Link& l : links_) l.transport->deregister(l.pool_registration);
  // transports_ are destroyed before pool_ frees the slab (declaration order).
}

bool DeviceContext::take_credit() noexcept {
  if (credits_.fetch_sub(1, std::memory_order_relaxed) > 0) return true;
  credits_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void DeviceContext::return_credit() noexcept { credits_.fetch_add(1, std::memory_order_relaxed); }

void DeviceContext::defer(std::function<bool()> step) {
  std::lock_guard<std::mutex> guard(deferred_mutex_);
  deferred_.push_back(std::move(step));
  deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
}

void DeviceContext::run_deferred() {
  // Relaxed: a stale zero only postpones the work to the next progress call.
  if (deferred_count_.load(std::memory_order_relaxed) == 0) return;
  // Only progress runs steps, under the poll lock, so running_ has one user. Swapping the two
  // vectors keeps both capacities: a busy device defers and runs steps without allocating.
  {
    std::unique_lock<std::mutex> guard(deferred_mutex_, std::try_to_lock);
    if (!guard.owns_lock()) return;
    running_.swap(deferred_);
    deferred_count_.store(0, std::memory_order_relaxed);
  }
  std::size_t kept = 0;  // the steps that still wait, moved to the front of running_ in order
  for (std::size_t i = 0; i < running_.size(); ++i) {
    bool went = false;
    try {
      went = running_[i]();
    } catch (...) {
      // The throwing step is dropped (its error propagates); the others keep waiting.
      for (std::size_t j = i + 1; j < running_.size(); ++j) running_[kept++] = std::move(running_[j]);
      running_.resize(kept);
      requeue_running();
      throw;
    }
    if (!went) {
      if (kept != i) running_[kept] = std::move(running_[i]);
      ++kept;
    }
  }
  running_.resize(kept);
  requeue_running();
}

void DeviceContext::requeue_running() {
  if (!running_.empty()) {
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    // The waiting steps are older than any deferred meanwhile: they keep their place in front.
    for (auto& step : deferred_) running_.push_back(std::move(step));
    deferred_.clear();
    running_.swap(deferred_);
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  } else {
    running_.clear();
  }
}

bool peer_gone_error(int rc) noexcept {
  switch (-rc) {
    case ECONNRESET: case ECONNREFUSED: case ECONNABORTED: case ENOTCONN: case EPIPE: case ESRCH:
    case EHOSTDOWN: case EHOSTUNREACH: case ENETUNREACH: case ENETDOWN: case ESHUTDOWN: case ECANCELED:
      return true;
    default:
      return false;
  }
}

void DeviceContext::bury(std::vector<Chunk>&& chunks, std::vector<Buffer>&& destinations) {
  std::lock_guard<std::mutex> guard(graveyard_mutex_);
  graveyard_.push_back(std::move(chunks));
  if (!destinations.empty()) buried_buffers_.push_back(std::move(destinations));
}

void DeviceContext::record_peer_failed(int rank, const std::string& how) noexcept { failures_.peer_failed(rank, how); }

Status DeviceContext::transport_error(const Link& l, const char* call, int rc, int rank) {
  if (peer_gone_error(rc) || peer_down(rank)) {
    failures_.peer_failed(rank, net::error_text(call, rc) + " over " + l.caps->name);
    return Status::make_failed(rank);
  }
  throw_transport(l, call, rc, rank);
}

Status DeviceContext::send_packet(Packet* p, int rank, std::size_t length) {
  if (__builtin_expect(peer_down(rank), 0)) {
    pool_->put(p);
    return Status::make_failed(rank);
  }
  Link& l = link(rank);
  if (length <= l.inject_size) {
    const int rc = l.transport->inject(rank, p->data(), length);
    pool_->put(p);
    if (rc == 0) return Status::make_done();
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
    return transport_error(l, "inject", rc, rank);
  }
  if (!take_credit()) {
    pool_->put(p);
    return Status::make_retry(RetryReason::send_queue);
  }
  p->send.rank = rank;
  p->ctx.set_kind(CtxKind::send_packet);  // release: after every field the completion reads
  const int rc = l.transport->send(rank, p->data(), length, l.pool_desc, &p->ctx);
  if (rc == 0) return Status::make_done();
  return_credit();
  pool_->put(p);
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
  return transport_error(l, "send", rc, rank);
}

void DeviceContext::deliver(std::uint16_t target, Completion&& c) noexcept { targets_.deliver(target, std::move(c)); }

std::size_t DeviceContext::context_in_flight() const noexcept {
  return open_ops_.load(std::memory_order_relaxed) +
         (credits_max_ - static_cast<std::size_t>(credits_.load(std::memory_order_relaxed))) +
         deferred_count_.load(std::memory_order_relaxed);
}

}  // namespace ferry::detail
