// reduce_ops.hpp — the reductions of ferry's collectives: inout[i] = inout[i] (op) in[i] for
// every element type and operation of ferry/coll.hpp, and the check that an operation is
// defined for a type (no bitwise operation on floating point).
#pragma once

#include <cstddef>

#include "ferry/coll.hpp"

namespace ferry::detail {

// What a collective combines with: the call's type, operation and user function.
struct Reduction {
  DataType type = DataType::i64;
  ReduceOp op = ReduceOp::sum;
  ReduceFn fn = nullptr;
  void* fn_arg = nullptr;
};

// Throws ferry::Error naming `call` and the values when the reduction is not defined.
void check_reduction(const char* call, const Reduction& r);
// `count` elements of r.type: inout = inout (op) in. The buffers need not be aligned.
void reduce_into(void* inout, const void* in, std::size_t count, const Reduction& r) noexcept;

}  // namespace ferry::detail
