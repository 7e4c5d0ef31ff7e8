#include "core/protocols/atomics.hpp"

#include <cerrno>
#include <cstring>
#include <exception>

#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

std::uint64_t PendingAtomics::add(const AtomicWait& w) {
  std::lock_guard<std::mutex> guard(mutex_);
  std::uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= UINT32_MAX) throw Error("post_atomic: more than 2^32 atomics wait for their replies");
    i = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[i];
  s.wait = w;
  s.used = true;
  return (static_cast<std::uint64_t>(s.generation) << 32) | i;
}

bool PendingAtomics::take(std::uint64_t id, int rank, AtomicWait& out) {
  const auto i = static_cast<std::uint32_t>(id);
  std::lock_guard<std::mutex> guard(mutex_);
  if (i >= slots_.size()) return false;
  Slot& s = slots_[i];
  if (!s.used || s.generation != static_cast<std::uint32_t>(id >> 32) || s.wait.rank != rank) return false;
  out = s.wait;
  s.used = false;
  ++s.generation;
  free_.push_back(i);
  return true;
}

void PendingAtomics::take_rank(int rank, std::vector<AtomicWait>& out) {
  std::lock_guard<std::mutex> guard(mutex_);
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.used || s.wait.rank != rank) continue;
    out.push_back(s.wait);
    s.used = false;
    ++s.generation;
    free_.push_back(i);
  }
}

namespace {

void finish(const AtomicWait& w, int error) noexcept {
  Completion c;
  c.op = OpKind::atomic;
  c.rank = w.rank;
  c.size = w.width;
  c.context = w.context;
  c.error = error;
  signal_local(w.local, std::move(c));
}

void write_result(void* result, std::uint32_t width, std::uint64_t value) noexcept {
  if (result == nullptr) return;
  if (width == 4) {
    const auto v = static_cast<std::uint32_t>(value);
    std::memcpy(result, &v, 4);
  } else {
    std::memcpy(result, &value, 8);
  }
}

}  // namespace

bool Atomics::perform_local(const AtomicArgs& a) {
  const std::size_t width = atomic_width(a.type);
  void* at = regions_.find(a.remote.base + a.offset, width, a.remote.key);
  if (at == nullptr) return false;
  write_result(a.result, static_cast<std::uint32_t>(width), apply_atomic(at, a.op, a.type, a.operand, a.compare));
  return true;
}

void Atomics::perform_at(unsigned char* at, const AtomicArgs& a) noexcept {
  write_result(a.result, static_cast<std::uint32_t>(atomic_width(a.type)), apply_atomic(at, a.op, a.type, a.operand, a.compare));
}

Status Atomics::post(const AtomicArgs& a) {
  Packet* p = dc_.pool().get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  const auto width = static_cast<std::uint32_t>(atomic_width(a.type));
  const std::uint64_t id = pending_.add({a.result, width, a.rank, a.local, a.context});
  dc_.open_op();
  encode(p->data(), WireHeader{MsgKind::atomic, static_cast<std::uint8_t>(a.op), static_cast<std::uint16_t>(a.type),
                               dc_.rank(), 0, 0});
  encode(p->data() + kHeader, AtomicBody{a.remote.base + a.offset, a.remote.key, a.operand, a.compare, id});
  Status s;
  try {
    s = dc_.send_packet(p, a.rank, kHeader + sizeof(AtomicBody));
  } catch (...) {
    AtomicWait w;
    if (pending_.take(id, a.rank, w)) dc_.close_op();
    throw;
  }
  if (s.is_retry() || s.kind == StatusKind::failed) {
    AtomicWait w;
    // Gone already: the peer's failure swept it and signalled its completion.
    if (!pending_.take(id, a.rank, w)) return Status::make_posted();
    dc_.close_op();
    return s;
  }
  return Status::make_posted();
}

bool Atomics::send_reply(int rank, const AtomicReply& r) {
  if (dc_.peer_down(rank)) return true;  // nobody waits for it
  Packet* p = dc_.pool().get();
  if (p == nullptr) return false;
  encode(p->data(), WireHeader{MsgKind::atomic_reply, 0, 0, dc_.rank(), 0, 0});
  encode(p->data() + kHeader, r);
  try {
    return !dc_.send_packet(p, rank, kHeader + sizeof(AtomicReply)).is_retry();
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "cannot answer rank %d's atomic: %s", rank, e.what());
    return true;
  }
}

void Atomics::on_request(Packet* p) {
  const auto h = decode<WireHeader>(p->data());
  const auto body = decode<AtomicBody>(p->data() + kHeader);
  dc_.pool().put(p);
  if (const char* why = check_atomic_request(h.reserved, h.target, body)) {
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(), "dropped an atomic request from rank %d: %s", h.src, why);
    dc_.count_malformed();
    return;
  }
  const auto type = static_cast<DataType>(h.target);
  AtomicReply reply{body.id, 0, 0, 0};
  if (void* at = regions_.find(body.addr, atomic_width(type), body.key)) {
    reply.value = apply_atomic(at, static_cast<AtomicOp>(h.reserved), type, body.operand, body.compare);
  } else {
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(), "rank %d's atomic names no region registered here (address %llx)", h.src,
                 static_cast<unsigned long long>(body.addr));
    reply.error = -EFAULT;
  }
  const int src = h.src;
  if (!send_reply(src, reply)) dc_.defer([this, src, reply] { return send_reply(src, reply); });
}

void Atomics::on_reply(Packet* p) {
  const auto src = decode<WireHeader>(p->data()).src;
  const auto r = decode<AtomicReply>(p->data() + kHeader);
  dc_.pool().put(p);
  AtomicWait w;
  if (!pending_.take(r.id, src, w)) {
    if (dc_.peer_down(src)) return;  // ended with the failure already
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(), "dropped an atomic reply from rank %d that names no atomic of it (id %llx)",
                 src, static_cast<unsigned long long>(r.id));
    dc_.count_malformed();
    return;
  }
  // -EFAULT is the one error an owner answers; anything else is not from a ferry peer.
  const int error = r.error == 0 || r.error == -EFAULT ? r.error : -EPROTO;
  if (error == 0) write_result(w.result, w.width, r.value);
  dc_.close_op();
  finish(w, error);
}

void Atomics::fail_peer(int rank) {
  std::vector<AtomicWait> gone;
  pending_.take_rank(rank, gone);
  for (const AtomicWait& w : gone) {
    dc_.close_op();
    finish(w, peer_failed_error);
  }
}

}  // namespace ferry::detail
