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

struct Schedule {
  std::vector<Round> rounds;
  Reduction reduction;                       // for the steps that reduce
  std::unique_ptr<unsigned char[]> scratch;  // what the algorithm needs besides the caller's buffers
  const char* algorithm = "";                // its name, for ferry-bench and the logs
  unsigned char* make_scratch(std::size_t bytes) {
    scratch = std::make_unique_for_overwrite<unsigned char[]>(bytes == 0 ? 1 : bytes);
    return scratch.get();
  }
};

// The builders, for member `me` of a team of `n` (algorithms.cpp). Sizes are in bytes; `elem`
// is the reduction's element size.
Schedule barrier_schedule(int n, int me);
Schedule broadcast_schedule(int n, int me, int root, unsigned char* buffer, std::size_t size);
Schedule reduce_schedule(int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                         const Reduction& r);
Schedule allreduce_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                            const Reduction& r);
Schedule reduce_scatter_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t block,
                                 const Reduction& r);
Schedule scan_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                       const Reduction& r);
Schedule gather_schedule(int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t size);
Schedule allgather_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t size);
Schedule allgatherv_schedule(int n, int me, const unsigned char* send, unsigned char* recv,
                             const std::vector<std::size_t>& counts, const std::vector<std::size_t>& offsets);
Schedule alltoallv_schedule(int n, int me, const unsigned char* send, const std::vector<std::size_t>& send_counts,
                            const std::vector<std::size_t>& send_offsets, unsigned char* recv,
                            const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_offsets);

}  // namespace ferry::detail
