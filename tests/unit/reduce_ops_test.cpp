// The collectives' reduction kernels: every type and operation, on aligned operands (the
// typed loop) and on operands one byte off (element by element), against a plain reference;
// and the checks that refuse an undefined reduction.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "coll/reduce_ops.hpp"
#include "ferry/error.hpp"

namespace {

using ferry::DataType;
using ferry::ReduceOp;
using ferry::detail::Reduction;

template <class T>
T reference(ReduceOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if (op == ReduceOp::sum) return static_cast<T>(static_cast<std::uint64_t>(static_cast<U>(a)) + static_cast<U>(b));
    if (op == ReduceOp::prod) return static_cast<T>(static_cast<std::uint64_t>(static_cast<U>(a)) * static_cast<U>(b));
    if (op == ReduceOp::band) return static_cast<T>(a & b);
    if (op == ReduceOp::bor) return static_cast<T>(a | b);
    if (op == ReduceOp::bxor) return static_cast<T>(a ^ b);
  } else {
    if (op == ReduceOp::sum) return a + b;
    if (op == ReduceOp::prod) return a * b;
  }
  if (op == ReduceOp::min) return a < b ? a : b;
  if (op == ReduceOp::max) return a < b ? b : a;
  if (op == ReduceOp::land) return static_cast<T>(a != 0 && b != 0);
  return static_cast<T>(a != 0 || b != 0);
}

template <class T>
void every_op(DataType type) {
  constexpr std::size_t n = 37;  // past any vector width, with a tail
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::band, ReduceOp::bor,
                      ReduceOp::bxor, ReduceOp::land, ReduceOp::lor}) {
    if (std::is_floating_point_v<T> && (op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor)) continue;
    std::vector<T> a(n), b(n), want(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<int>(i % 7) - 2);
      b[i] = static_cast<T>(static_cast<int>((i * 5) % 9) - 3);
      want[i] = reference(op, a[i], b[i]);
    }
    const Reduction r{type, op};
    for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
      std::vector<unsigned char> x(n * sizeof(T) + 1), y(n * sizeof(T) + 1);
      std::memcpy(x.data() + shift, a.data(), n * sizeof(T));
      std::memcpy(y.data() + 1 - shift, b.data(), n * sizeof(T));  // the other operand off when x is not
      ferry::detail::reduce_into(x.data() + shift, y.data() + 1 - shift, n, r);
      std::vector<T> got(n);
      std::memcpy(got.data(), x.data() + shift, n * sizeof(T));
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], want[i]) << ferry::to_string(type) << " " << ferry::to_string(op) << " element " << i << " shift " << shift;
      }
    }
  }
}

TEST(ReduceOps, EveryTypeAndOperationAlignedOrNot) {
  every_op<std::int8_t>(DataType::i8);
  every_op<std::uint8_t>(DataType::u8);
  every_op<std::int16_t>(DataType::i16);
  every_op<std::uint16_t>(DataType::u16);
  every_op<std::int32_t>(DataType::i32);
  every_op<std::uint32_t>(DataType::u32);
  every_op<std::int64_t>(DataType::i64);
  every_op<std::uint64_t>(DataType::u64);
  every_op<float>(DataType::f32);
  every_op<double>(DataType::f64);
}

TEST(ReduceOps, UndefinedReductionsAreRefusedByName) {
  const auto what = [](const Reduction& r) {
    try {
      ferry::detail::check_reduction("post_allreduce", r);
    } catch (const ferry::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(what({DataType::f32, ReduceOp::band}), "ferry: post_allreduce: op=band is not defined for type=f32");
  EXPECT_EQ(what({DataType::i32, ReduceOp::user}), "ferry: post_allreduce: op=user with fn=null");
  EXPECT_EQ(what({static_cast<DataType>(99), ReduceOp::sum}), "ferry: post_allreduce: type=99 is not a DataType");
  EXPECT_EQ(what({DataType::i32, static_cast<ReduceOp>(42)}), "ferry: post_allreduce: op=42 is not a ReduceOp");
  EXPECT_EQ(what({DataType::u64, ReduceOp::bxor}), "accepted");
}

}  // namespace
