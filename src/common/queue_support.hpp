// queue_support.hpp — what the bounded queues share: the element requirement, capacity
// rounding, and handing a popped element to the caller.
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

namespace ferry::detail {

// An element the lock-free queues can hold: moved in, out and (on a refused push) back without
// throwing, since a move that threw halfway through a push or pop would lose or duplicate it.
template <class T>
concept QueueElement = std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>;

// The ring sizes of the queues: at least n and at least 2, a power of two (index = pos & mask).
constexpr std::size_t round_up_pow2(std::size_t n) noexcept {
  std::size_t p = 2;
  while (p < n) p <<= 1;
  return p;
}

// Moves a popped element to the caller. Into an empty std::optional it move-constructs in
// place, which for a fat element (a Completion with its Buffer and vector) saves the
// move-assignment's release-what-was-there checks and a second move on the way out.
template <class T>
void take_into(T& out, T&& item) noexcept {
  out = std::move(item);
}
template <class T>
void take_into(std::optional<T>& out, T&& item) noexcept {
  out.emplace(std::move(item));
}

}  // namespace ferry::detail
