// ferry-fi-msgrate: the "raw libfabric" message-rate baseline for ferry-bench msgrate.
//
// The same schedule as ferry's msgrate (windows of --window messages, each answered by an
// 8-byte acknowledgement, after a warmup), written directly on an FI_EP_RDM endpoint with
// fi_inject / fi_send and pre-posted fi_recv buffers, single-threaded, with no protocol header.
// It is the best a ferry-like layer could do on the same provider.
//
// fi_pingpong has no rate mode (its Mxfers/sec is just 1 / usec-per-transfer of the ping-pong),
// hence this program. It needs no launcher: it forks its own peer (bench::run_forked_pair,
// before libfabric is touched: providers are not fork-safe once initialised) and the two swap
// their fi_getname addresses over a socketpair, so it runs anywhere libfabric does.
//
//   ferry-fi-msgrate --provider shm --size 8 --count 100000 --window 64 --json
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

using bench::Clock;

std::string fi_err(const char* call, long rc) {
  return std::string(call) + " failed: " + fi_strerror(static_cast<int>(-rc)) + " (" + std::to_string(rc) + ")";
}

void check(const char* call, long rc) {
  if (rc != 0) throw std::runtime_error(fi_err(call, rc));
}

struct Options {
  std::string provider = "shm";
  bench::MsgrateArgs rate;
  double timeout_s = 120.0;
};

// Why a completion arrived; its fi_context2 must be the first member so op_context maps back.
struct Slot {
  fi_context2 ctx{};
  enum Kind { data_recv, ack_recv, send } kind = send;
  unsigned char* buf = nullptr;
};

class Peer {
 public:
  Peer(const Options& o, int rank, int sock) : o_(o), rank_(rank), sock_(sock) {}
  ~Peer() { close_all(); }

  void setup() {
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr) throw std::runtime_error("fi_allocinfo failed");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    // One thread drives the endpoint: the cheapest threading level, as a hand-written baseline would choose.
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = strdup(o_.provider.c_str());
    const int rc = fi_getinfo(FI_VERSION(1, 11), nullptr, nullptr, 0, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0) throw std::runtime_error(fi_err("fi_getinfo", rc) + " for provider '" + o_.provider + "' (FI_EP_RDM)");
    provider_name_ = info_->fabric_attr->prov_name;
    check("fi_fabric", fi_fabric(info_->fabric_attr, &fabric_, nullptr));
    check("fi_domain", fi_domain(fabric_, info_, &domain_, nullptr));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = std::max<std::size_t>(info_->tx_attr->size + info_->rx_attr->size, 128);
    check("fi_cq_open", fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    check("fi_av_open", fi_av_open(domain_, &av_attr, &av_, nullptr));
    check("fi_endpoint", fi_endpoint(domain_, info_, &ep_, nullptr));
    check("fi_ep_bind(av)", fi_ep_bind(ep_, &av_->fid, 0));
    check("fi_ep_bind(cq)", fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV));

    // Receive slots: enough that a whole window lands in posted buffers, as it does in ferry
    // (whose devices keep FERRY_PREPOST receives posted), capped by what the provider queues.
    const std::size_t size = static_cast<std::size_t>(o_.rate.size);
    nrecv_ = rank_ == 1 ? static_cast<std::size_t>(std::min<std::int64_t>(o_.rate.window, 
                                                                           static_cast<std::int64_t>(info_->rx_attr->size)))
                        : 1;
    slot_bytes_ = std::max<std::size_t>(size, kAck);
    memory_.assign(slot_bytes_ * (nrecv_ + 1), 0);
    send_buf_ = memory_.data() + slot_bytes_ * nrecv_;
    if (rank_ == 0) {
      bench::fill_pattern(send_buf_, size, 0, 0);
    } else {
      bench::fill_pattern(send_buf_, kAck, 1, 0);
    }
    if ((info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
      check("fi_mr_reg", fi_mr_reg(domain_, memory_.data(), memory_.size(), FI_SEND | FI_RECV, 0, 0, 0, &mr_, nullptr));
      if ((info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
        check("fi_mr_bind", fi_mr_bind(mr_, &ep_->fid, 0));
        check("fi_mr_enable", fi_mr_enable(mr_));
      }
      desc_ = fi_mr_desc(mr_);
    }
    check("fi_enable", fi_enable(ep_));
    slots_.resize(nrecv_);
    for (std::size_t i = 0; i < nrecv_; ++i) {
      slots_[i].kind = rank_ == 1 ? Slot::data_recv : Slot::ack_recv;
      slots_[i].buf = memory_.data() + slot_bytes_ * i;
    }
    send_slot_.kind = Slot::send;

    // Swap addresses with the peer process.
    char name[256];
    std::size_t len = sizeof name;
    check("fi_getname", fi_getname(&ep_->fid, name, &len));
    const std::uint32_t len32 = static_cast<std::uint32_t>(len);
    bench::write_all(sock_, &len32, sizeof len32);
    bench::write_all(sock_, name, len);
    std::uint32_t peer_len = 0;
    bench::read_all(sock_, &peer_len, sizeof peer_len);
    if (peer_len > sizeof name) throw std::runtime_error("peer address too long");
    char peer_name[256];
    bench::read_all(sock_, peer_name, peer_len);
    const int n = fi_av_insert(av_, peer_name, 1, &peer_, 0, nullptr);
    if (n != 1) throw std::runtime_error(fi_err("fi_av_insert", n));

    for (auto& s : slots_) post_recv(s);
    // Both sides have their receives posted before the first message is sent.
    char byte = 'r';
    bench::write_all(sock_, &byte, 1);
    bench::read_all(sock_, &byte, 1);
  }

  // Rank 0: windows of sends, each followed by waiting for the ack.
  double run_sender() {
    const std::int64_t warmup = warmup_count();
    windows(warmup, [&](std::int64_t k, bool, bool) { send_window(k); });
    const auto t0 = Clock::now();
    windows(o_.rate.count, [&](std::int64_t k, bool, bool) { send_window(k); });
    const double secs = bench::seconds_since(t0);
    while (sends_done_ < sends_posted_) poll();
    return secs;
  }

  void run_receiver() {
    const std::int64_t warmup = warmup_count();
    auto recv_window = [&](std::int64_t k, bool first, bool last) {
      const std::int64_t target = received_ + k;
      first_in_window_ = first ? received_ : -1;
      last_in_window_ = last ? target - 1 : -1;
      while (received_ < target) poll();
      send(send_buf_, kAck);
    };
    windows(warmup, recv_window);
    windows(o_.rate.count, recv_window);
    while (sends_done_ < sends_posted_) poll();
  }

  // Lets the other process finish its last receive before either closes its endpoint.
  void finish() {
    char byte = 'f';
    bench::write_all(sock_, &byte, 1);
    bench::read_all(sock_, &byte, 1);
  }

  const std::string& provider_name() const { return provider_name_; }

 private:
  static constexpr std::size_t kAck = 8;

  std::int64_t warmup_count() const {
    return o_.rate.warmup < 0 ? std::min(o_.rate.window, o_.rate.count) : o_.rate.warmup;
  }

  template <class Fn>
  void windows(std::int64_t n, Fn&& per_window) {
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t k = std::min(o_.rate.window, n - done);
      per_window(k, done == 0, done + k == n);
      done += k;
    }
  }

  void send_window(std::int64_t k) {
    const std::int64_t acks = acks_ + 1;
    for (std::int64_t i = 0; i < k; ++i) send(send_buf_, static_cast<std::size_t>(o_.rate.size));
    while (acks_ < acks) poll();
  }

  void send(const void* buf, std::size_t n) {
    if (n <= info_->tx_attr->inject_size) {
      for (;;) {
        const ssize_t rc = fi_inject(ep_, buf, n, peer_);
        if (rc == 0) return;
        if (rc != -FI_EAGAIN) throw std::runtime_error(fi_err("fi_inject", rc));
        poll();
      }
    }
    // Every send shares one slot: the buffer is only read, and completions are only counted.
    for (;;) {
      const ssize_t rc = fi_send(ep_, buf, n, desc_, peer_, &send_slot_.ctx);
      if (rc == 0) {
        ++sends_posted_;
        return;
      }
      if (rc != -FI_EAGAIN) throw std::runtime_error(fi_err("fi_send", rc));
      poll();
    }
  }

  void post_recv(Slot& s) {
    for (;;) {
      const ssize_t rc = fi_recv(ep_, s.buf, slot_bytes_, desc_, FI_ADDR_UNSPEC, &s.ctx);
      if (rc == 0) return;
      if (rc != -FI_EAGAIN) throw std::runtime_error(fi_err("fi_recv", rc));
      poll();
    }
  }

  void poll() {
    fi_cq_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) {
      if (Clock::now() > deadline_) throw std::runtime_error("timed out waiting for the peer");
      return;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq_, &err, 0);
      throw std::runtime_error(std::string("completion error: ") +
                               fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0));
    }
    if (n < 0) throw std::runtime_error(fi_err("fi_cq_read", n));
    for (ssize_t i = 0; i < n; ++i) {
      auto* s = static_cast<Slot*>(entries[i].op_context);
      switch (s->kind) {
        case Slot::send:
          ++sends_done_;
          break;
        case Slot::ack_recv:
          ++acks_;
          post_recv(*s);
          break;
        case Slot::data_recv: {
          const auto size = static_cast<std::size_t>(o_.rate.size);
          const bool full = received_ == first_in_window_ || received_ == last_in_window_;
          if (!bench::check_ends(s->buf, size, 0, 0) || (full && bench::check_pattern(s->buf, size, 0, 0) >= 0)) {
            throw std::runtime_error("message " + std::to_string(received_) + " has a wrong payload");
          }
          ++received_;
          post_recv(*s);
          break;
        }
      }
    }
  }

  void close_all() {
    if (ep_ != nullptr) fi_close(&ep_->fid);
    if (mr_ != nullptr) fi_close(&mr_->fid);
    if (av_ != nullptr) fi_close(&av_->fid);
    if (cq_ != nullptr) fi_close(&cq_->fid);
    if (domain_ != nullptr) fi_close(&domain_->fid);
    if (fabric_ != nullptr) fi_close(&fabric_->fid);
    if (info_ != nullptr) fi_freeinfo(info_);
    ep_ = nullptr;
    info_ = nullptr;
  }

  const Options& o_;
  int rank_;
  int sock_;
  Clock::time_point deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(o_.timeout_s));
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_mr* mr_ = nullptr;
  void* desc_ = nullptr;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  std::string provider_name_;
  std::vector<unsigned char> memory_;
  std::size_t slot_bytes_ = 0;
  std::size_t nrecv_ = 0;
  unsigned char* send_buf_ = nullptr;
  std::vector<Slot> slots_;
  Slot send_slot_;
  std::int64_t sends_posted_ = 0;
  std::int64_t sends_done_ = 0;
  std::int64_t acks_ = 0;
  std::int64_t received_ = 0;
  std::int64_t first_in_window_ = -1;
  std::int64_t last_in_window_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ferry-fi-msgrate: raw libfabric (FI_EP_RDM) message rate, the baseline for ferry-bench msgrate"};
  app.name("ferry-fi-msgrate");
  app.add_option("-p,--provider", o.provider, "libfabric provider (shm, tcp, ...)");
  bench::add_msgrate_options(&app, o.rate);
  app.add_option("--timeout", o.timeout_s, "give up after this many seconds")->check(CLI::PositiveNumber);
  if (const int code = bench::parse_or_exit_code(app, argc, argv, false); code >= 0) return code;

  return bench::run_forked_pair("ferry-fi-msgrate", [&](int rank, int sock) {
    Peer peer(o, rank, sock);
    peer.setup();
    if (rank == 1) {
      peer.run_receiver();
      peer.finish();
      return;
    }
    const double secs = peer.run_sender();
    peer.finish();
    const double rate = static_cast<double>(o.rate.count) / secs;
    const std::int64_t warmup = o.rate.warmup < 0 ? std::min(o.rate.window, o.rate.count) : o.rate.warmup;
    if (o.rate.json) {
      bench::print_json(nlohmann::json{{"bench", "fi_msgrate"},
                                       {"size", o.rate.size},
                                       {"threads", 1},
                                       {"devices", 1},
                                       {"provider", peer.provider_name()},
                                       {"ranks", 2},
                                       {"count", o.rate.count},
                                       {"window", o.rate.window},
                                       {"warmup", warmup},
                                       {"total_messages", o.rate.count},
                                       {"seconds", secs},
                                       {"msgs_per_s", rate},
                                       {"mbytes_per_s", rate * static_cast<double>(o.rate.size) / 1e6}});
    } else {
      std::printf("fi_msgrate size %lld B  provider %s: %.0f msgs/s (%lld messages in windows of %lld, %.3f s)\n",
                  static_cast<long long>(o.rate.size), peer.provider_name().c_str(), rate,
                  static_cast<long long>(o.rate.count), static_cast<long long>(o.rate.window), secs);
    }
  });
}
