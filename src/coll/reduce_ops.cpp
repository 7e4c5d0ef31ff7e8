// reduce_ops.cpp — the reduction kernels, one loop per (type, operation), over memcpy'd
// elements so a receive buffer inside a packet (any alignment) can be an operand.
#include "coll/reduce_ops.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "ferry/error.hpp"

namespace ferry {

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
    case ReduceOp::bxor: return "bxor";
    case ReduceOp::land: return "land";
    case ReduceOp::lor: return "lor";
    case ReduceOp::user: return "user";
  }
  return "?";
}


namespace detail {

namespace {

template <class T, class F>
void combine(void* inout, const void* in, std::size_t count, F f) noexcept {
  // Aligned operands (the caller's arrays, ferry's landing buffers): a plain loop the compiler
  // vectorises. Otherwise (data inside a packet, at any offset) element by element.
  if (reinterpret_cast<std::uintptr_t>(inout) % alignof(T) == 0 && reinterpret_cast<std::uintptr_t>(in) % alignof(T) == 0) {
    T* __restrict a = static_cast<T*>(inout);
    const T* __restrict b = static_cast<const T*>(in);
    for (std::size_t i = 0; i < count; ++i) a[i] = f(a[i], b[i]);
    return;
  }
  auto* a = static_cast<unsigned char*>(inout);
  const auto* b = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    T x, y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    const T z = f(x, y);
    std::memcpy(a + i * sizeof(T), &z, sizeof(T));
  }
}

template <class T>
void reduce_typed(void* inout, const void* in, std::size_t count, ReduceOp op) noexcept {
  // Integer sums and products wrap (computed unsigned: no undefined overflow).
  using W = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;
  switch (op) {
    case ReduceOp::sum:
      combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(static_cast<W>(x) + static_cast<W>(y)); });
      break;
    case ReduceOp::prod:
      combine<T>(inout, in, count, [](T x, T y) {
        if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(unsigned)) {
          return static_cast<T>(static_cast<unsigned>(static_cast<W>(x)) * static_cast<unsigned>(static_cast<W>(y)));
        } else {
          return static_cast<T>(static_cast<W>(x) * static_cast<W>(y));
        }
      });
      break;
    case ReduceOp::min: combine<T>(inout, in, count, [](T x, T y) { return std::min(x, y); }); break;
    case ReduceOp::max: combine<T>(inout, in, count, [](T x, T y) { return std::max(x, y); }); break;
    case ReduceOp::land: combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(x != T{} && y != T{}); }); break;
    case ReduceOp::lor: combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(x != T{} || y != T{}); }); break;
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::band) combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(x & y); });
        if (op == ReduceOp::bor) combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(x | y); });
        if (op == ReduceOp::bxor) combine<T>(inout, in, count, [](T x, T y) { return static_cast<T>(x ^ y); });
      }
      break;
    case ReduceOp::user: break;
  }
}

}  // namespace

void check_reduction(const char* call, const Reduction& r) {
  if (size_of(r.type) == 0) throw Error(std::string(call) + ": type=" + std::to_string(static_cast<int>(r.type)) + " is not a DataType");
  if (static_cast<int>(r.op) > static_cast<int>(ReduceOp::user)) {
    throw Error(std::string(call) + ": op=" + std::to_string(static_cast<int>(r.op)) + " is not a ReduceOp");
  }
  if (r.op == ReduceOp::user && r.fn == nullptr) throw Error(std::string(call) + ": op=user with fn=null");
  const bool floating = r.type == DataType::f32 || r.type == DataType::f64;
  if (floating && (r.op == ReduceOp::band || r.op == ReduceOp::bor || r.op == ReduceOp::bxor)) {
    throw Error(std::string(call) + ": op=" + to_string(r.op) + " is not defined for type=" + to_string(r.type));
  }
}

void reduce_into(void* inout, const void* in, std::size_t count, const Reduction& r) noexcept {
  if (count == 0) return;
  if (r.op == ReduceOp::user) {
    r.fn(inout, in, count, r.fn_arg);
    return;
  }
  switch (r.type) {
    case DataType::i8: reduce_typed<std::int8_t>(inout, in, count, r.op); break;
    case DataType::u8: reduce_typed<std::uint8_t>(inout, in, count, r.op); break;
    case DataType::i16: reduce_typed<std::int16_t>(inout, in, count, r.op); break;
    case DataType::u16: reduce_typed<std::uint16_t>(inout, in, count, r.op); break;
    case DataType::i32: reduce_typed<std::int32_t>(inout, in, count, r.op); break;
    case DataType::u32: reduce_typed<std::uint32_t>(inout, in, count, r.op); break;
    case DataType::i64: reduce_typed<std::int64_t>(inout, in, count, r.op); break;
    case DataType::u64: reduce_typed<std::uint64_t>(inout, in, count, r.op); break;
    case DataType::f32: reduce_typed<float>(inout, in, count, r.op); break;
    case DataType::f64: reduce_typed<double>(inout, in, count, r.op); break;
  }
}

}  // namespace detail
}  // namespace ferry
