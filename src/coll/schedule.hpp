// schedule.hpp — a collective as data: the rounds of one member's part of one collective.
//
// Each round runs its local steps (copies and reductions within this rank), then posts its
// sends, and ends once every send has completed locally and every receive has arrived; only
// then are the receives applied (copied into place, or reduced into it). So a send may read a
// buffer that a receive of the same round updates: the send is done with it first. Messages
// are named by (collective, step, sender); an algorithm gives each message a step number its
// sender and receiver agree on. Pointers point into the caller's buffers or the schedule's
// scratch, which lives as long as the schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "coll/reduce_ops.hpp"

namespace ferry::detail {

struct LocalStep {
  unsigned char* dst = nullptr;
  const unsigned char* src = nullptr;
  std::size_t size = 0;  // bytes
  bool reduce = false;   // dst = dst (op) src, over size / element-size elements; else a copy
};

struct SendStep {
  int peer = 0;  // team index
  std::uint16_t step = 0;
  const unsigned char* data = nullptr;
  std::size_t size = 0;
};

struct RecvStep {
  int peer = 0;
  std::uint16_t step = 0;
  unsigned char* dst = nullptr;
  std::size_t size = 0;  // bytes expected: a message of another size is a protocol error
  bool reduce = false;
};

struct Round {
  std::vector<LocalStep> locals;
  std::vector<SendStep> sends;
  std::vector<RecvStep> recvs;
};

// Made once per pooled operation and refilled by each collective it runs: reset() keeps every
// vector's capacity, so a team's steady stream of collectives allocates nothing here.
class Schedule {
 public:
  void reset(const char* algorithm, const Reduction& reduction = {}) noexcept {
    count_ = 0;
    algorithm_ = algorithm;
    reduction_ = reduction;
  }
  // A new last round, empty.
  Round& add_round() {
    if (count_ == rounds_.size()) rounds_.emplace_back();
    Round& r = rounds_[count_++];
    r.locals.clear();
    r.sends.clear();
    r.recvs.clear();
    return r;
  }
  std::size_t size() const noexcept { return count_; }
  Round& operator[](std::size_t i) noexcept { return rounds_[i]; }
  const Reduction& reduction() const noexcept { return reduction_; }
  const char* algorithm() const noexcept { return algorithm_; }
  // `bytes` of memory besides the caller's buffers, kept for the next collective.
  unsigned char* scratch(std::size_t bytes) {
    if (bytes > scratch_size_ || scratch_ == nullptr) {
      scratch_ = std::make_unique_for_overwrite<unsigned char[]>(bytes == 0 ? 1 : bytes);
      scratch_size_ = bytes;
    }
    return scratch_.get();
  }

 private:
  std::vector<Round> rounds_;
  std::size_t count_ = 0;
  Reduction reduction_;
  const char* algorithm_ = "";
  std::unique_ptr<unsigned char[]> scratch_;
  std::size_t scratch_size_ = 0;
};

// The builders, for member `me` of a team of `n` (algorithms.cpp), each into a reset `s`.
// Sizes are in bytes.
void barrier_schedule(Schedule& s, int n, int me);
void broadcast_schedule(Schedule& s, int n, int me, int root, unsigned char* buffer, std::size_t size);
// The root's n blocks scattered down the binomial tree, then a ring allgather of them.
void scatter_allgather_broadcast_schedule(Schedule& s, int n, int me, int root, unsigned char* buffer, std::size_t size);
void reduce_schedule(Schedule& s, int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                     const Reduction& r);
// `ring`: the ring (reduce-scatter, then allgather, of n blocks of elements), else recursive doubling.
void allreduce_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                        const Reduction& r, bool ring = false);
void reduce_scatter_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t block,
                             const Reduction& r);
void scan_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                   const Reduction& r);
void gather_schedule(Schedule& s, int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t size);
// `ring`, or recursive doubling where n is a power of two (else the ring).
void allgather_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t size,
                        bool ring = false);
void allgatherv_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv,
                         const std::vector<std::size_t>& counts, const std::vector<std::size_t>& offsets);
void alltoallv_schedule(Schedule& s, int n, int me, const unsigned char* send, const std::vector<std::size_t>& send_counts,
                        const std::vector<std::size_t>& send_offsets, unsigned char* recv,
                        const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_offsets);

}  // namespace ferry::detail
