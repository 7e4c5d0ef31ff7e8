// ferry-ucp-pingpong: a bare UCP active-message ping-pong, set up as ferry's ucx backend sets up
// UCX, with a chosen amount of work between a message's arrival and its answer.
//
// It is the floor under ferry-bench pingpong over UCX: the same context features (AM and RMA,
// workers shared), worker thread mode (serialized), endpoints (no peer error handling), send
// call (ucp_am_send_nbx, eager, forced immediate completion, no UCP header) and message size
// (--size 24: ferry's 16-byte header and an 8-byte payload), answering from inside UCX's
// receive callback as a ferry Handler does (--answer callback) or from the polling loop after
// the callback as ucx_perftest does (--answer loop). --work N runs N iterations of an empty
// loop before the answer, standing for what any layer above UCX does with a message (check its
// header, find its target, build its completion, call the application): the output says how
// long that work takes on its own (work_ns) and what it adds to the one-way latency. --after N
// runs the loop after each answer (a runtime's bookkeeping once it sent) and --idle N after
// each ucp_worker_progress call (a polling loop as long as a runtime's): after_ns, idle_ns.
// --work-on 0|1 puts the work on one rank only (ucx_perftest's ping-pong does its own
// bookkeeping between a reply and the next message on the rank that starts, after the answer
// on the other). --features am, --thread-mode single and --send plain set UCX up as
// ucx_perftest's AM tests do instead (AM only, a single-threaded worker, sends with a
// completion callback and no flags), to tell ferry's choices from the benchmark's structure.
//
// No launcher: it forks its peer (bench::run_forked_pair), and the two swap worker addresses
// over a socketpair.
//
//   ferry-ucp-pingpong --size 24 --iters 1000000 --work 60 --json
#include <ucp/api/ucp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

using bench::Clock;

constexpr unsigned kAmId = 3;

struct Options {
  std::int64_t size = 24;
  std::int64_t iters = 1000000;
  std::int64_t warmup = 10000;
  std::int64_t work = 0;
  std::int64_t idle = 0;
  std::int64_t after = 0;
  std::string answer = "callback";
  std::string work_on = "both";  // which rank runs --work: both, 0 (the one that starts) or 1
  std::string features = "am,rma";      // the context's features: ferry asks for both
  std::string thread_mode = "serialized";
  std::string send_mode = "eager-imm";  // ferry's send flags; "plain" as ucx_perftest sends
  double timeout_s = 60.0;
  bool json = false;
};

[[gnu::noinline]] void busy(std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) asm volatile("" ::: "memory");
}

// The work loop's own time, in ns per run of `n` iterations (median of 5 timings of a batch;
// a batch is at most about 2x10^8 iterations, so a large n is timed in seconds, not hours).
double work_ns(std::int64_t n) {
  if (n == 0) return 0.0;
  const std::int64_t runs = std::clamp<std::int64_t>(std::int64_t{200000000} / n, 1, 200000);
  std::vector<double> t;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = Clock::now();
    for (std::int64_t r = 0; r < runs; ++r) busy(n);
    t.push_back(bench::seconds_since(t0) / static_cast<double>(runs) * 1e9);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

std::string ucs(const char* call, ucs_status_t s) { return std::string(call) + ": " + ucs_status_string(s); }

class Peer {
 public:
  Peer(const Options& o, int rank, int sock) : o_(o), rank_(rank), sock_(sock), msg_(static_cast<std::size_t>(o.size)) {
    std::memset(msg_.data(), 0x5a, msg_.size());
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      void* r = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  void setup() {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_config_read", s));
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = o_.features == "am" ? UCP_FEATURE_AM : (UCP_FEATURE_RMA | UCP_FEATURE_AM);
    params.mt_workers_shared = o_.features == "am" ? 0 : 1;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_init", s));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = o_.thread_mode == "single" ? UCS_THREAD_MODE_SINGLE : UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_worker_create", s));
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    s = ucp_worker_get_address(worker_, &address, &length);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_worker_get_address", s));
    const std::uint64_t n = length;
    bench::write_all(sock_, &n, sizeof n);
    bench::write_all(sock_, address, length);
    ucp_worker_release_address(worker_, address);
    std::uint64_t peer_len = 0;
    bench::read_all(sock_, &peer_len, sizeof peer_len);
    if (peer_len == 0 || peer_len > (1u << 20)) throw std::runtime_error("the peer's worker address is implausible");
    std::vector<unsigned char> peer(peer_len);
    bench::read_all(sock_, peer.data(), peer.size());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(worker_, &ep, &ep_);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_ep_create", s));
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = kAmId;
    hp.cb = &Peer::on_data;
    hp.arg = this;
    s = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (s != UCS_OK) throw std::runtime_error(ucs("ucp_worker_set_am_recv_handler", s));
    sync();
  }

  // One run of `n` round trips; rank 0 starts it and returns its half round trip in us.
  double run(std::int64_t n) {
    received_ = 0;
    last_ = n;
    sync();
    const auto t0 = Clock::now();
    if (rank_ == 0) send();
    std::int64_t seen = 0;
    std::uint32_t polls = 0;
    while (received_ < n) {
      ucp_worker_progress(worker_);
      if (o_.idle != 0) busy(o_.idle);
      if (!in_callback() && received_ != seen) {
        seen = received_;
        if (work_ != 0) busy(work_);
        if (rank_ == 1 || seen < n) send();
        if (o_.after != 0) busy(o_.after);
      }
      if ((++polls & 0xFFFF) == 0 && Clock::now() > deadline_) throw std::runtime_error("timed out waiting for the peer");
    }
    const double us = bench::seconds_since(t0) / static_cast<double>(n) / 2.0 * 1e6;
    sync();
    return us;
  }

  void finish() {
    for (int i = 0; i < 1000; ++i) ucp_worker_progress(worker_);
    sync();
  }

 private:
  bool in_callback() const noexcept { return callback_; }

  void sync() {
    char c = 1;
    bench::write_all(sock_, &c, 1);
    bench::read_all(sock_, &c, 1);
  }

  static void sent(void* request, ucs_status_t, void*) { ucp_request_free(request); }

  void send() {
    ucp_request_param_t p;
    if (plain_send_) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
      p.cb.send = &Peer::sent;
    } else {
      p.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL | UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_AM_SEND_FLAG_EAGER;
    }
    for (;;) {
      void* r = ucp_am_send_nbx(ep_, kAmId, nullptr, 0, msg_.data(), msg_.size(), &p);
      if (r == nullptr) return;
      if (UCS_PTR_IS_PTR(r)) return;  // plain: the callback frees it once sent
      if (UCS_PTR_STATUS(r) != UCS_ERR_NO_RESOURCE) throw std::runtime_error(ucs("ucp_am_send_nbx", UCS_PTR_STATUS(r)));
      ucp_worker_progress(worker_);  // the peer's queue is full: drain ours, try again
    }
  }

  static ucs_status_t on_data(void* arg, const void*, std::size_t header_length, void* data, std::size_t length,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Peer*>(arg);
    // A wrong message is counted (the run goes on, no hang) and reported at the end.
    if (header_length != 0 || length != self->msg_.size() || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      self->bad_ = true;
    } else {
      std::memcpy(self->in_, data, length);
    }
    const std::int64_t n = ++self->received_;
    if (self->in_callback()) {
      if (self->work_ != 0) busy(self->work_);
      if (self->rank_ == 1 || n < self->last_) self->send();
      busy(self->o_.after);
    }
    return UCS_OK;
  }

 public:
  bool bad() const noexcept { return bad_; }

 private:
  const Options& o_;
  int rank_;
  int sock_;
  std::vector<unsigned char> msg_;
  unsigned char in_[256]{};
  // Read on every turn and every send: not string compares.
  const bool callback_ = o_.answer == "callback";
  const bool plain_send_ = o_.send_mode == "plain";
  const std::int64_t work_ = o_.work_on == "both" || o_.work_on == std::to_string(rank_) ? o_.work : 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  std::int64_t received_ = 0;
  std::int64_t last_ = 0;
  bool bad_ = false;
  Clock::time_point deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(o_.timeout_s));
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ferry-ucp-pingpong: a bare UCP active-message ping-pong set up as ferry's ucx backend, "
               "with --work between a message's arrival and its answer"};
  app.name("ferry-ucp-pingpong");
  app.add_option("--size", o.size, "message bytes (24: ferry's header and an 8-byte payload)")->check(CLI::Range(1, 256));
  app.add_option("--iters", o.iters, "timed round trips")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--warmup", o.warmup, "untimed round trips first")->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--work", o.work, "empty-loop iterations between a message's arrival and its answer")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--work-on", o.work_on, "which rank runs --work: both, 0 (the one that starts each round trip) or 1")
      ->check(CLI::IsMember({"both", "0", "1"}));
  app.add_option("--after", o.after, "empty-loop iterations after each answer (a runtime's bookkeeping once it sent)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 16));
  app.add_option("--idle", o.idle,
                 "empty-loop iterations after each progress call: a polling loop as long as a runtime's")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 16));
  app.add_option("--answer", o.answer, "where the answer is sent: callback (inside UCX's receive callback, as a "
                                       "ferry Handler) or loop (after it, from the polling loop, as ucx_perftest)")
      ->check(CLI::IsMember({"callback", "loop"}));
  app.add_option("--features", o.features, "the context's features: am,rma (as ferry) or am (as ucx_perftest's AM tests)")
      ->check(CLI::IsMember({"am", "am,rma"}));
  app.add_option("--thread-mode", o.thread_mode, "the worker's thread mode: serialized (as ferry) or single")
      ->check(CLI::IsMember({"serialized", "single"}));
  app.add_option("--send", o.send_mode, "send flags: eager-imm (eager, forced immediate completion, as ferry) or "
                                        "plain (a completion callback and no flags, as ucx_perftest)")
      ->check(CLI::IsMember({"eager-imm", "plain"}));
  app.add_option("--timeout", o.timeout_s, "give up after this many seconds")->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "one JSON object");
  if (const int code = bench::parse_or_exit_code(app, argc, argv, false); code >= 0) return code;

  return bench::run_forked_pair("ferry-ucp-pingpong", [&](int rank, int sock) {
    double us = 0.0;
    {
      Peer peer(o, rank, sock);
      peer.setup();
      if (o.warmup > 0) peer.run(o.warmup);
      us = peer.run(o.iters);
      peer.finish();
      if (peer.bad()) throw std::runtime_error("a message arrived with an unexpected size or header");
    }
    if (rank != 0) return;
    const double wns = work_ns(o.work);
    if (o.json) {
      bench::print_json(nlohmann::json{{"bench", "ucp_pingpong"},
                                       {"size", o.size},
                                       {"iters", o.iters},
                                       {"work", o.work},
                                       {"work_ns", wns},
                                       {"after", o.after},
                                       {"after_ns", work_ns(o.after)},
                                       {"idle", o.idle},
                                       {"idle_ns", work_ns(o.idle)},
                                       {"answer", o.answer},
                                       {"work_on", o.work_on},
                                       {"features", o.features},
                                       {"thread_mode", o.thread_mode},
                                       {"send", o.send_mode},
                                       {"half_rtt_us", us}});
    } else {
      std::printf("ucp_pingpong size %lld B  answer %s  work %lld (%.1f ns alone): half round trip %.3f us\n",
                  static_cast<long long>(o.size), o.answer.c_str(), static_cast<long long>(o.work), wns, us);
    }
  });
}
