// Accelerate's distributed operations and its walkers over nested collections (docs/api.md,
// "Accelerate-style operations"), in chorus::accelerate, an inline namespace: chorus::gather and
// chorus::accelerate::gather are the same function; write the second where it helps the reader
// (it concatenates to the main process, where ProcessGroup::gather stacks onto a root).
//
// The operations are free functions on the default group (init_process_group first; with no
// default group, i.e. one process, they act on this process alone), collective over it unless
// they say otherwise. The walkers (honor_type ... convert_outputs_to_fp32) work on c10::IValue
// trees of GenericDict (string or int keys), GenericList, Tuple (named tuples keep their names)
// and leaves, keep the container kinds exactly, and never communicate.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/ivalue_convert.h"
#include "chorus/process_group.h"

namespace chorus {
inline namespace accelerate {

// ---- operations (collective over the default group) ----------------------------------------

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

// ---- walkers over nested collections (local) ------------------------------------------------

// A container of the same kind as `like` (list: its element type when the items fit it; tuple:
// its name and field names) holding `items`. Throws InvalidArgument when `like` is no list or
// tuple.
c10::IValue honor_type(const c10::IValue& like, std::vector<c10::IValue> items);

// data with fn applied to every tensor; other leaves are kept, or raise InvalidArgument naming
// their path when error_on_other_type.
c10::IValue recursively_apply(const std::function<c10::IValue(const at::Tensor&)>& fn, const c10::IValue& data,
                              bool error_on_other_type = false);

bool is_torch_tensor(const c10::IValue& value);

// What get_data_structure puts in place of a tensor: a named tuple TensorInformation(shape, dtype).
struct TensorInformation {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  c10::IValue to_ivalue() const;
  // Throws InvalidArgument when `value` is not one (see is_tensor_information).
  static TensorInformation from_ivalue(const c10::IValue& value);
};
bool is_tensor_information(const c10::IValue& value);
// data with every tensor replaced by its TensorInformation.
c10::IValue get_data_structure(const c10::IValue& data);
// The inverse: empty tensors in place of every TensorInformation.
c10::IValue initialize_tensors(const c10::IValue& data_structure);

// Concatenates along `dim` the matching tensors of several collections of the same structure
// (lists/tuples by position, dicts by key). Throws InvalidArgument on an empty list, a non-tensor
// leaf, or structures that differ.
c10::IValue concatenate(const std::vector<c10::IValue>& data, int64_t dim = 0);
// Every tensor's rows [start, stop) (dim 0, Python slice rules); other leaves kept.
c10::IValue slice_tensors(const c10::IValue& data, int64_t start, int64_t stop);
// Every tensor moved to `device`; values of dicts under a key in skip_keys stay where they are.
c10::IValue send_to_device(const c10::IValue& data, const at::Device& device, bool non_blocking = false,
                           const std::vector<std::string>& skip_keys = {});
// Dim 0 of the first tensor (lists and tuples: their first element; dicts: their first value).
// Throws InvalidArgument on an empty container, a 0-d tensor, or a non-tensor leaf.
int64_t find_batch_size(const c10::IValue& data);
// The device of the first tensor found, or nullopt when there is none.
std::optional<at::Device> find_device(const c10::IValue& data);
// f16 and bf16 tensors as f32; everything else untouched.
c10::IValue convert_to_fp32(const c10::IValue& data);

// fn wrapped so that its output (a tensor or an IValue collection) comes back through
// convert_to_fp32.
template <class F>
auto convert_outputs_to_fp32(F fn) {
  return [fn = std::move(fn)](auto&&... args) {
    auto out = fn(std::forward<decltype(args)>(args)...);
    if constexpr (std::is_same_v<std::decay_t<decltype(out)>, at::Tensor>)
      return convert_to_fp32(c10::IValue(out)).toTensor();
    else
      return convert_to_fp32(c10::IValue(std::move(out)));
  };
}

}  // namespace accelerate

// ---- implementation ---------------------------------------------------------------------------

namespace detail {
c10::IValue broadcast_default(const c10::IValue& obj, int src, const char* what);
}  // namespace detail

inline namespace accelerate {
template <class T>
T broadcast_object(const T& obj, int src) {
  return from_ivalue<T>(detail::broadcast_default(to_ivalue(obj), src, "broadcast_object"));
}
}  // namespace accelerate
}  // namespace chorus
