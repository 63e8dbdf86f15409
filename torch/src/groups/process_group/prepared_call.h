// Note [One body per collective]: each collective of ProcessGroup is written once, as a function
// that prepares it on the caller's thread (checks its tensors, where a bad one rejects at once on
// every rank; allocates its outputs) and returns its body: the core calls, then the copies into
// targets that were not contiguous. The blocking form runs the body now; the async form queues
// the same body behind the earlier async calls (Communicator::submit), with the caller's handle as
// the queued Work itself (Note [One Work per call]). The body holds its tensors, so they live until
// it finished. Point to point is the exception: an async send or receive must take its place in
// its (peer, direction) order when issued, so it goes through the core's send_async, recv_async
// and recv_any_async instead.
//
// The helpers the bodies share: process_group.cc (the collectives of the C++ API) and
// list_collectives.cc (torch.distributed's list and coalesced forms).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/communicator.h"
#include "groups/agreement.h"
#include "groups/tensor_util.h"

namespace chorus::detail {

struct PreparedCall {
  std::vector<at::Tensor> outputs;  // the collective's new tensors (TensorWork::result)
  std::function<void()> body;
};

inline std::vector<at::Tensor> run_now(PreparedCall p) {
  p.body();
  return std::move(p.outputs);
}

// target = what the core wrote into buf, when they are different tensors (non-contiguous target).
inline void write_back(const at::Tensor& target, const at::Tensor& buf) {
  if (!buf.is_same(target)) const_cast<at::Tensor&>(target).copy_(buf);
}

inline void* data_of(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr() : nullptr; }

// The contiguous tensor the core reads and writes for a caller's tensor.
struct Buffer {
  at::Tensor tensor;
  DataType dtype;
  size_t count;
  void* data() const { return data_of(tensor); }
};

// The buffer of an input (or in-place) tensor; a bad one rejects `op` on every rank.
Buffer input(Communicator& comm, const at::Tensor& t, const char* op, std::optional<ReduceOp> reduce = std::nullopt);

// A contiguous tensor the core can write for the caller's output `t`: t itself, or a staging
// tensor that write_back copies into t afterwards.
inline at::Tensor writable(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
}

// Why `out` cannot receive `want` elements of t's dtype (all_gather_into, reduce_scatter_into,
// the list forms); empty when it can. `contiguous`: the core writes it directly.
std::string output_problem(const at::Tensor& out, const at::Tensor& t, int64_t want, bool contiguous);

// Note [Agreeing on a list]: a coalesced call runs one core collective per tensor or per dtype,
// and the core compares each of those between the ranks, but not how the lists split into them:
// two ranks could pass [3, 5] and [5, 3] elements and get a wrong answer. So the body first
// requires the same `call` (the list as text) of every rank (require_same, agreement.h).
inline constexpr const char* kSameList = "every rank must pass the same list of tensors";

// "f32[2, 3], i64[4]"
std::string list_string(const std::vector<at::Tensor>& tensors);

}  // namespace chorus::detail
