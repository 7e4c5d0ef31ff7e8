// scripted_transport.hpp — a net::Transport whose arriving messages are a script of byte
// frames, for feeding a real device's receive path bytes no ferry peer would send.
//
// Every frame is delivered, in order, into the next posted receive as a message from rank 0
// (truncated, with -EMSGSIZE, when longer than the receive, as a transport reports it), or,
// set to lend (set_lends), lent whole, at most lend_limit() per poll, until the next poll. Sends
// and RMA complete at the next poll without moving data. Notices given at construction (put
// notifications: remote writes with data) are reported first (a get leaves its destination as it
// was: the bytes a hostile peer would supply are irrelevant to the receiver's bookkeeping);
// injects are dropped. Single-threaded: the fuzz harness is the only caller.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "core/op_context.hpp"
#include "net/transport.hpp"

namespace ferry::fuzz {

class ScriptedRegistration final : public net::Registration {
 public:
  std::uint64_t key() const noexcept override { return 0; }
  void* desc() const noexcept override { return nullptr; }
};

class ScriptedTransport final : public net::Transport {
 public:
  // `notices`: remote writes with data (put notifications) to report, before the frames.
  explicit ScriptedTransport(std::vector<std::vector<unsigned char>> frames, std::vector<net::Event> notices = {})
      : frames_(frames.begin(), frames.end()), done_(notices.begin(), notices.end()) {
    caps_.name = "scripted";
    caps_.inject_size = 4096;
    caps_.max_msg_size = std::size_t{1} << 30;
    caps_.max_rma_size = std::size_t{1} << 20;
    caps_.remote_data_bytes = 8;
    caps_.send_queue = 64;
  }

  bool done() const noexcept { return frames_.empty() && done_.empty(); }
  // For tests of what a device refuses on a transport with fewer capabilities.
  void set_remote_data_bytes(std::size_t n) noexcept { caps_.remote_data_bytes = n; }
  void set_inject_size(std::size_t n) noexcept { caps_.inject_size = n; }
  // The rank each frame is reported from (0 unless set; -1: the transport names none).
  void set_source(int rank) noexcept { source_ = rank; }
  void set_reports_source(bool on) noexcept { caps_.reports_source = on; }
  // The next `n` post_recv calls are refused with -EAGAIN (no resources now).
  void refuse_recvs(int n) noexcept { refuse_recvs_ = n; }
  std::size_t posted_recvs() const noexcept { return posted_.size(); }
  // Receives::lent: no posted receives (post_recv is -ENOSYS); each poll lends frames.
  void set_lends(bool on) noexcept { caps_.receives = on ? net::Receives::lent : net::Receives::posted; }
  bool lends() const noexcept { return caps_.receives == net::Receives::lent; }

  std::string address() const override { return {}; }
  void connect(const std::vector<std::string>&) override {}
  int inject(int, const void*, std::size_t) override { return 0; }
  int send(int rank, const void*, std::size_t len, void*, net::OpContext* ctx) override { return complete(rank, len, ctx); }
  int post_recv(void* buf, std::size_t len, void*, net::OpContext* ctx) override {
    if (lends()) return -ENOSYS;
    if (refuse_recvs_ > 0) {
      --refuse_recvs_;
      return -EAGAIN;
    }
    posted_.push_back(Posted{static_cast<unsigned char*>(buf), len, ctx});
    return 0;
  }
  int put(int rank, const void*, std::size_t len, void*, std::uint64_t, std::uint64_t, net::OpContext* ctx) override {
    return complete(rank, len, ctx);
  }
  int put_data(int rank, const void*, std::size_t len, void*, std::uint64_t, std::uint64_t, std::uint64_t,
               net::OpContext* ctx) override {
    return complete(rank, len, ctx);
  }
  int inject_put(int, const void*, std::size_t, std::uint64_t, std::uint64_t) override { return 0; }
  int get(int rank, void*, std::size_t len, void*, std::uint64_t, std::uint64_t, net::OpContext* ctx) override {
    return complete(rank, len, ctx);
  }

  int poll(net::Event* events, int max) override {
    int n = 0;
    while (n < max && !done_.empty()) {
      events[n++] = done_.front();
      done_.pop_front();
    }
    lent_.clear();  // what the previous poll lent
    while (lends() && n < max && !frames_.empty() && static_cast<int>(lent_.size()) < lend_limit()) {
      lent_.push_back(std::move(frames_.front()));
      frames_.pop_front();
      net::Event& ev = events[n++];
      ev = net::Event{};
      ev.rank = source_;
      ev.length = lent_.back().size();
      ev.lent = lent_.back().data();
    }
    while (n < max && !frames_.empty() && !posted_.empty()) {
      const std::vector<unsigned char>& f = frames_.front();
      const Posted r = posted_.front();
      posted_.pop_front();
      const std::size_t copied = std::min(f.size(), r.len);
      if (copied != 0) std::memcpy(r.buf, f.data(), copied);
      net::Event& ev = events[n++];
      ev = net::Event{};
      ev.context = r.ctx;
      ev.rank = source_;
      ev.length = copied;
      ev.error = f.size() <= r.len ? 0 : -EMSGSIZE;
      frames_.pop_front();
    }
    return n;
  }

  net::Registration* register_memory(const void*, std::size_t, net::Access) override { return new ScriptedRegistration; }
  void cancel_all() noexcept override {
    posted_.clear();
    done_.clear();
  }

 private:
  struct Posted {
    unsigned char* buf;
    std::size_t len;
    net::OpContext* ctx;
  };

  int complete(int rank, std::size_t len, net::OpContext* ctx) {
    net::Event ev;
    ev.context = ctx;
    ev.rank = rank;
    ev.length = len;
    done_.push_back(ev);
    return 0;
  }

  std::deque<std::vector<unsigned char>> frames_;
  std::deque<Posted> posted_;
  std::deque<std::vector<unsigned char>> lent_;  // frames the last poll lent
  std::deque<net::Event> done_;
  int source_ = 0;
  int refuse_recvs_ = 0;
};

}  // namespace ferry::fuzz
