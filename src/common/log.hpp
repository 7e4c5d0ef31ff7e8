// log.hpp — ferry's diagnostics on stderr, one leveled line per call.
//
//   FERRY_LOG(warn, "dropped a %zu-byte header", size);
//       -> "ferry: rank 3: dropped a 512-byte header"        (the process rank, set_log_rank)
//   FERRY_LOG_AT(error, rank, device, "receive failed: %s", what);
//       -> "ferry: rank 3 device 1: receive failed: ..."      (rank or device < 0: left out)
//
// Contract
//  - Levels, most severe first: error, warn, info, debug; `off` silences everything. A line
//    is written when its level is at or above the process-wide threshold set by
//    set_log_level() (default warn). Any thread may log or change the threshold at any time.
//  - Each call writes exactly one line ending in '\n' with a single write(2) on stderr, so
//    lines of different threads (and processes sharing the stream) do not interleave.
//    A line longer than kMaxLogLine bytes is cut and ends in "...".
//  - Cheap when off: the macros test the level with one relaxed load and an inline compare
//    before evaluating any argument. Logging never allocates and never throws, so it may be
//    used on paths that handle out-of-memory or run in destructors; it does make a system
//    call, so it belongs on error and slow paths only, never per message at warn or above.
//  - The state (threshold, process rank) is one per process: it lives in libferry, which
//    every ferry layer links.
//
// Memory order: the threshold is loaded relaxed. It guards no other data — a thread that
// reads it only decides whether to format a line — so no ordering with other memory is
// needed; a thread that races with set_log_level() writes or skips a line or two around the
// change, which is the same outcome as if the change had come a moment earlier or later.
// The process rank is relaxed for the same reason (it only labels lines).
#pragma once

#include <atomic>
#include <cstddef>

#include "ferry/log_level.hpp"

namespace ferry::detail {

using ferry::LogLevel;  // public: RuntimeSettings::log carries it

inline constexpr std::size_t kMaxLogLine = 2048;

// The threshold as an int (a LogLevel value). Defined in log.cpp; read inline by the macros.
extern std::atomic<int> log_threshold;

inline bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= log_threshold.load(std::memory_order_relaxed);
}

void set_log_level(LogLevel level) noexcept;
LogLevel log_level() noexcept;

// The level's names are those of FERRY_LOG's row in the core's option table, which parses them.

// The rank FERRY_LOG puts in its prefix; -1 (the default) leaves it out. The runtime sets it
// once it knows its rank.
void set_log_rank(int rank) noexcept;
int log_rank() noexcept;

// Writes "ferry: rank R device D: <message>\n" (parts with a negative value left out) with
// one write(2). Called through the macros, after log_enabled(level).
void log_line(LogLevel level, int rank, int device, const char* format, ...) noexcept
    __attribute__((format(printf, 4, 5)));

}  // namespace ferry::detail

// level is a bare LogLevel name: error, warn, info or debug.
#define FERRY_LOG_AT(level, rank, device, ...)                                                 \
  do {                                                                                         \
    if (::ferry::detail::log_enabled(::ferry::detail::LogLevel::level)) {                      \
      ::ferry::detail::log_line(::ferry::detail::LogLevel::level, (rank), (device), __VA_ARGS__); \
    }                                                                                          \
  } while (0)

#define FERRY_LOG(level, ...) FERRY_LOG_AT(level, ::ferry::detail::log_rank(), -1, __VA_ARGS__)
