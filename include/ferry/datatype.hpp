// ferry/datatype.hpp — the element types of collectives (ferry/coll.hpp) and remote atomics
// (Device::post_atomic).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

enum class DataType : std::uint8_t { i8, u8, i16, u16, i32, u32, i64, u64, f32, f64 };

const char* to_string(DataType type) noexcept;
std::size_t size_of(DataType type) noexcept;

}  // namespace ferry
