// Accelerate-style operations: free functions on the default group (init_process_group first;
// with no default group, i.e. one process, they act on this process alone). All are collective
// over the default group unless they say otherwise.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/collections.h"
#include "chorus/ivalue_convert.h"
#include "chorus/process_group.h"

namespace chorus {

// In place: every rank's t becomes from_process's t (same shape and dtype everywhere).
void broadcast(at::Tensor& t, int from_process = 0);
// Every rank's t concatenated along dim 0 (0-d tensors as one row; dim 0 may differ between
// ranks), on the main process; nullopt elsewhere.
std::optional<at::Tensor> gather(const at::Tensor& t);
// The same for every tensor of a collection, on the main process; None (IValue()) elsewhere.
c10::IValue gather(const c10::IValue& data);
// In place over every rank (and returned): "sum", "mean" (floating types only), or "none".
at::Tensor reduce(at::Tensor& t, std::string_view reduction = "mean");
at::Tensor reduce(at::Tensor& t, ReduceOp op);
// t padded along dim (negative counts from the end) to the largest size any rank has there,
// with pad_index, at the end (or the start when pad_first). Tensors with fewer dims than dim are
// returned as they are.
at::Tensor pad_across_processes(const at::Tensor& t, int64_t dim = 0, double pad_index = 0, bool pad_first = false);

// objects becomes from_process's list on every rank (any IValues; tensors inside move as raw
// bytes). Objects may differ in size between ranks.
void broadcast_object_list(std::vector<c10::IValue>& objects, int from_process = 0);
// Every rank's obj in rank order, on the main process; nullopt elsewhere.
std::optional<std::vector<c10::IValue>> gather_object(const c10::IValue& obj);
// Every rank's obj in rank order, on every rank.
std::vector<c10::IValue> all_gather_object(const c10::IValue& obj);
// src's obj on every rank, with its C++ type (see ivalue_convert.h for the types that move).
template <class T>
T broadcast_object(const T& obj, int src = 0);

// A barrier over the default group (nothing with one process).
void wait_for_everyone();
// Copies rank 0's random state to every rank: rng_types "torch" (the default CPU generator) and
// "generator" (the one passed). "cuda", "xla" and others are InvalidArgument in this CPU build.
void synchronize_rng_states(const std::vector<std::string>& rng_types = {"torch"},
                            std::optional<at::Generator> generator = std::nullopt);
// Not collective: seeds torch's default generator with seed (+ this process's rank when
// device_specific).
void set_seed(uint64_t seed, bool device_specific = false);

namespace detail {
c10::IValue broadcast_default(const c10::IValue& obj, int src, const char* what);
}  // namespace detail

template <class T>
T broadcast_object(const T& obj, int src) {
  return from_ivalue<T>(detail::broadcast_default(to_ivalue(obj), src, "broadcast_object"));
}

}  // namespace chorus
