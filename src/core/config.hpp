// config.hpp — the option table resolved into typed values (options.hpp has the table).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ferry/options.hpp"

namespace ferry::detail {

struct Config {
  std::string bootstrap;
  std::string provider;
  int devices;
  std::size_t packet_size;
  std::size_t packets;
  std::size_t prepost;
  std::size_t recv_descriptors;
  std::size_t send_credits;
  std::size_t cq_capacity;
  std::size_t max_targets;
  std::size_t rdv_threshold;
  std::string fragment;        // auto, off
  std::size_t fragment_max;
  std::string lock_model;      // lockless, trylock, block, lockq, csync, offload
  std::string completion;      // cq, cq_ms, cq_lock, sync
  std::string header;          // am, sendrecv
  std::string progress;        // explicit, implicit, thread:N, steal
  int progress_threads;        // N of thread:N, else 0
  std::string device_polling;  // local, random, global
  std::string parcel_queues;   // shared, device
};

// Explicit option, else environment, else default. Throws ferry::Error on a malformed value,
// naming the variable and the value.
Config resolve_config(const RuntimeOptions& options);

// "4096", "8k", "64KiB", "1M", "2g" -> bytes. `what` names the setting in the error message.
std::size_t parse_size(std::string_view what, std::string_view text);

// The process-wide default for a CompletionQueue's capacity (FERRY_CQ_CAPACITY).
std::size_t default_cq_capacity();

}  // namespace ferry::detail
