// Walking nested collections (Accelerate's utils): c10::IValue trees of GenericDict (string or
// int keys), GenericList, Tuple (named tuples keep their names) and leaves. Every walker keeps
// the container kinds exactly. Local: none of these communicates.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chorus {

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

}  // namespace chorus
