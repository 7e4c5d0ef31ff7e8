// recv_blocks.hpp — reusable heap blocks for payloads that arrive past a packet: rendezvous
// active messages, the zero-copy parts of iovec active messages, and messages reassembled
// from fragments.
//
// Why: a fresh block per large message costs the receiver a page fault per page (past glibc's
// mmap threshold every block is a new mapping, unmapped again on free), which caps a stream of
// 1 MiB messages far below memory bandwidth. A block that comes back is kept, already mapped,
// for the next message of its size class.
//
// Contract
//  - take(size) and give(block) may be called by any thread at any time, including after
//    every Runtime is gone (a delivered Buffer may outlive its runtime), so the cache is one
//    per process and never destroyed.
//  - take returns a block of at least `size` bytes that starts `offset` bytes (mod 64) past a
//    cache line, or nullptr when memory is short (the caller reports it). give takes only what
//    take returned. The offset lets a copy run co-aligned with its source: with source and
//    destination at different offsets within a cache line, a 1 MiB cross-memory-attach copy
//    ran 5 to 10% slower on this project's test machine.
//  - Blocks are grouped in power-of-two classes from 4 KiB to 1 GiB; a larger block is never
//    kept. Each class keeps at most kSlots blocks, and the cache keeps at most `limit` bytes in
//    all (FERRY_RECV_CACHE, set by each Runtime; 0 keeps nothing). A block that finds no room
//    is freed.
//  - Blocks whose class is at least FERRY_RECV_HUGE bytes (set by each Runtime; 0: none)
//    are mappings of their own whose payload starts on a 2 MiB boundary, advised
//    (MADV_HUGEPAGE) to live on 2 MiB pages: a single-copy write into them by another process
//    (process_vm_writev) pins one page per 2 MiB instead of 512, which on this project's test
//    machine moved 1 MiB at 49-50 GB/s against 15 GB/s into 4 KiB pages. Such a block holds at
//    least 2 MiB (a 1 MiB block costs twice its size); the cache counts what blocks hold.
//  - Not on the small-message path: a class's list is guarded by a spin lock held for a
//    handful of loads and stores, and an empty class falls back to the allocator.
//
// Memory orders: the class lists are read and written only under their lock (acquire/release
// through SpinLock). The byte count and the limit are relaxed: they decide whether a block is
// kept, never what memory holds; two racing gives may together exceed the limit by at most one
// block each, and the next give that finds the count over the limit frees its block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::detail {

namespace recv_blocks {

inline constexpr std::size_t kSlots = 64;  // blocks kept per class: a window of 64 messages in flight

// A block of at least `size` bytes at `offset` (mod 64) past a cache line, or nullptr when
// memory is short.
void* take(std::size_t size, std::size_t offset = 0) noexcept;
// Returns a block from take(): kept for reuse if its class and the limit have room, else freed.
void give(void* block) noexcept;
// Bytes the cache may keep in all (FERRY_RECV_CACHE); kept blocks past it are freed at once.
void set_limit(std::size_t bytes) noexcept;
// Blocks of at least this many bytes (their class's size) come on 2 MiB pages; 0: none.
void set_huge_from(std::size_t bytes) noexcept;
// Whether a block from take() is on 2 MiB pages (its mapping was advised so).
bool huge(const void* block) noexcept;
// Bytes kept now (exact when no thread is in take or give).
std::size_t cached_bytes() noexcept;
// Frees every kept block; returns the bytes they held.
std::size_t release_cached() noexcept;
// Frees every kept block once no take or give has happened for `rest_ns` (steady clock, as
// `now_ns`), as seen by the calls to this that came since; returns the bytes freed. Called
// periodically (FERRY_TRIM_IDLE_MS, from progress's slow path); one caller at a time, others
// return 0 at once. A cache released stays so until it is used again.
std::size_t release_if_rested(std::int64_t now_ns, std::int64_t rest_ns) noexcept;

// A Buffer::Release for blocks from take().
inline void release(void*, void* block) noexcept { give(block); }

}  // namespace recv_blocks

}  // namespace ferry::detail
