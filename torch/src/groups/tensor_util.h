// Tensors as the core sees them: dtype mapping, checks with messages that say what to do.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "chorus/core/dtype.h"
#include "chorus/core/error.h"

namespace chorus::detail {

// The core dtype that carries a tensor dtype (complex as pairs of its real type) and how many of
// its elements make one tensor element; nullopt when chorus cannot move the dtype.
struct CoreType {
  DataType dtype;
  size_t per_element;
};
std::optional<CoreType> core_type(at::ScalarType type);

// Why `t` cannot take part in a collective (with reduction `op` when given); empty when it can.
std::string tensor_problem(const at::Tensor& t, std::optional<ReduceOp> op = std::nullopt);

// "f32[2, 3]"
std::string describe(const at::Tensor& t);
std::string shape_string(at::IntArrayRef sizes);

// t itself when its memory can be moved as it is (contiguous, no lazy conjugate or negation
// bits), else such a copy. Free in the common case: no dispatcher call.
inline at::Tensor plain(const at::Tensor& t) {
  if (t.is_contiguous() && !t.is_conj() && !t.is_neg()) return t;
  return t.resolve_conj().resolve_neg().contiguous();
}

// A contiguous tensor of `sizes` over base's storage, `offset` elements in (strided variant:
// `strides`). Not an autograd view: it can be detached in place, and making it costs no
// dispatcher call.
at::Tensor alias_of(const at::Tensor& base, at::IntArrayRef sizes, int64_t offset);
at::Tensor alias_of(const at::Tensor& base, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset);

// Elements of the core dtype that carry t.
inline size_t core_count(const at::Tensor& t) { return size_t(t.numel()) * core_type(t.scalar_type())->per_element; }

}  // namespace chorus::detail
