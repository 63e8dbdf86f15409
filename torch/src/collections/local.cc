// The local operations on collections (no communication): Accelerate's walkers over tensors in
// lists, tuples and dicts. Those that map leaves walk with collections/tree.h.
#include "chorus/accelerate.h"

#include <ATen/core/function_schema.h>

#include <algorithm>

#include "chorus/core/error.h"
#include "collections/tree.h"

namespace chorus {

using detail::concat;
using detail::tree::item_type;

namespace {

// Leaves of the local walks: everything but containers, and TensorInformation (a named tuple).
bool local_leaf(const c10::IValue& v) { return !detail::tree::is_container(v) || is_tensor_information(v); }

c10::IValue map_tensors(const c10::IValue& data, const std::function<c10::IValue(const at::Tensor&)>& fn,
                        bool error_on_other_type, const char* what) {
  return detail::tree::map_leaves(data, local_leaf, [&](const c10::IValue& leaf, size_t index) -> c10::IValue {
    if (leaf.isTensor()) return fn(leaf.toTensor());
    if (error_on_other_type)
      throw InvalidArgument(concat(what, ": ", detail::tree::leaf_path(data, index, local_leaf), " is a ",
                                   leaf.type()->annotation_str(),
                                   ", but only tensors (in lists, tuples and dicts) can go here"));
    return leaf;
  });
}

c10::TupleTypePtr tensor_information_type() {
  static const auto type =
      c10::TupleType::createNamed(c10::QualifiedName("TensorInformation"), std::vector<std::string>{"shape", "dtype"},
                                  std::vector<c10::TypePtr>{c10::ListType::ofInts(), c10::IntType::get()});
  return type;
}

}  // namespace

inline namespace accelerate {

c10::IValue honor_type(const c10::IValue& like, std::vector<c10::IValue> items) {
  if (!like.isList() && !like.isTuple())
    throw InvalidArgument(concat("honor_type: a ", like.type()->annotation_str(), " is not a list or a tuple"));
  return detail::tree::rebuild(like, std::move(items), false);
}

c10::IValue recursively_apply(const std::function<c10::IValue(const at::Tensor&)>& fn, const c10::IValue& data,
                              bool error_on_other_type) {
  return map_tensors(data, fn, error_on_other_type, "recursively_apply");
}

bool is_torch_tensor(const c10::IValue& value) { return value.isTensor(); }

c10::IValue TensorInformation::to_ivalue() const {
  return c10::ivalue::Tuple::createNamed({c10::IValue(c10::List<int64_t>(shape)), c10::IValue(int64_t(dtype))},
                                         tensor_information_type());
}

bool is_tensor_information(const c10::IValue& value) {
  if (!value.isTuple()) return false;
  auto type = value.type()->cast<c10::TupleType>();
  return type && type->name() && type->name()->name() == "TensorInformation" &&
         value.toTupleRef().elements().size() == 2;
}

TensorInformation TensorInformation::from_ivalue(const c10::IValue& value) {
  if (!is_tensor_information(value))
    throw InvalidArgument(concat("not a TensorInformation: a ", value.type()->annotation_str()));
  const auto& e = value.toTupleRef().elements();
  return TensorInformation{e[0].toIntVector(), at::ScalarType(e[1].toInt())};
}

c10::IValue get_data_structure(const c10::IValue& data) {
  return map_tensors(
      data,
      [](const at::Tensor& t) {
        return TensorInformation{t.sizes().vec(), t.scalar_type()}.to_ivalue();
      },
      false, "get_data_structure");
}

c10::IValue initialize_tensors(const c10::IValue& data_structure) {
  return detail::tree::map_leaves(data_structure, local_leaf, [](const c10::IValue& leaf, size_t) -> c10::IValue {
    if (!is_tensor_information(leaf)) return leaf;
    auto info = TensorInformation::from_ivalue(leaf);
    return at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
  });
}

c10::IValue concatenate(const std::vector<c10::IValue>& data, int64_t dim) {
  if (data.empty()) throw InvalidArgument("concatenate: the list of collections is empty");
  const c10::IValue& first = data[0];
  auto same_kind = [&](bool ok) {
    if (!ok) throw InvalidArgument("concatenate: the collections differ in structure (kind or length)");
  };
  if (first.isList() || first.isTuple()) {
    auto elems = [](const c10::IValue& v) { return v.isList() ? v.toList().vec() : v.toTupleRef().elements().vec(); };
    const size_t n = elems(first).size();
    std::vector<c10::IValue> items;
    for (size_t i = 0; i < n; ++i) {
      std::vector<c10::IValue> column;
      for (const auto& d : data) {
        same_kind((d.isList() || d.isTuple()) && d.isList() == first.isList() && elems(d).size() == n);
        column.push_back(elems(d)[i]);
      }
      items.push_back(concatenate(column, dim));
    }
    return honor_type(first, std::move(items));
  }
  if (first.isGenericDict()) {
    auto dict = first.toGenericDict();
    std::vector<c10::IValue> values;
    for (const auto& item : dict) {
      std::vector<c10::IValue> column;
      for (const auto& d : data) {
        same_kind(d.isGenericDict() && d.toGenericDict().size() == dict.size() &&
                  d.toGenericDict().contains(item.key()));
        column.push_back(d.toGenericDict().at(item.key()));
      }
      values.push_back(concatenate(column, dim));
    }
    c10::impl::GenericDict out(dict.keyType(), item_type(dict.valueType(), values));
    size_t i = 0;
    for (const auto& item : dict) out.insert(item.key(), std::move(values[i++]));
    return out;
  }
  std::vector<at::Tensor> tensors;
  for (const auto& d : data) {
    if (!d.isTensor())
      throw InvalidArgument(concat("concatenate: found a ", d.type()->annotation_str(),
                                   " where only tensors (in lists, tuples and dicts) can be concatenated"));
    tensors.push_back(d.toTensor());
  }
  return at::cat(tensors, dim);
}

c10::IValue slice_tensors(const c10::IValue& data, int64_t start, int64_t stop) {
  return map_tensors(
      data, [&](const at::Tensor& t) -> c10::IValue { return t.dim() ? t.slice(0, start, stop) : t; }, false,
      "slice_tensors");
}

c10::IValue send_to_device(const c10::IValue& data, const at::Device& device, bool non_blocking,
                           const std::vector<std::string>& skip_keys) {
  if (data.isTensor()) return data.toTensor().to(device, non_blocking);
  if (data.isGenericDict()) {
    auto dict = data.toGenericDict();
    std::vector<c10::IValue> values;
    for (const auto& item : dict) {
      const bool skip = item.key().isString() &&
                        std::find(skip_keys.begin(), skip_keys.end(), item.key().toStringRef()) != skip_keys.end();
      values.push_back(skip ? item.value() : send_to_device(item.value(), device, non_blocking, skip_keys));
    }
    c10::impl::GenericDict out(dict.keyType(), item_type(dict.valueType(), values));
    size_t i = 0;
    for (const auto& item : dict) out.insert(item.key(), std::move(values[i++]));
    return out;
  }
  if (data.isList() || data.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& i : data.isList() ? data.toList().vec() : data.toTupleRef().elements().vec())
      items.push_back(send_to_device(i, device, non_blocking, skip_keys));
    return honor_type(data, std::move(items));
  }
  return data;
}

int64_t find_batch_size(const c10::IValue& data) {
  if (data.isList() || data.isTuple()) {
    const auto items = data.isList() ? data.toList().vec() : data.toTupleRef().elements().vec();
    if (items.empty()) throw InvalidArgument("find_batch_size: the data is an empty list or tuple");
    return find_batch_size(items[0]);
  }
  if (data.isGenericDict()) {
    auto dict = data.toGenericDict();
    if (dict.empty()) throw InvalidArgument("find_batch_size: the data is an empty dict");
    return find_batch_size(dict.begin()->value());
  }
  if (!data.isTensor())
    throw InvalidArgument(concat("find_batch_size: found a ", data.type()->annotation_str(),
                                 " where a tensor (or a list, tuple or dict starting with one) was expected"));
  const auto& t = data.toTensor();
  if (t.dim() == 0) throw InvalidArgument("find_batch_size: the first tensor is 0-d and has no batch dimension");
  return t.size(0);
}

std::optional<at::Device> find_device(const c10::IValue& data) {
  if (data.isTensor()) return data.toTensor().device();
  if (data.isList() || data.isTuple()) {
    for (const auto& i : data.isList() ? data.toList().vec() : data.toTupleRef().elements().vec())
      if (auto d = find_device(i)) return d;
  }
  if (data.isGenericDict())
    for (const auto& item : data.toGenericDict())
      if (auto d = find_device(item.value())) return d;
  return std::nullopt;
}

c10::IValue convert_to_fp32(const c10::IValue& data) {
  return map_tensors(
      data,
      [](const at::Tensor& t) -> c10::IValue {
        const auto type = t.scalar_type();
        return type == at::kHalf || type == at::kBFloat16 ? t.to(at::kFloat) : t;
      },
      false, "convert_to_fp32");
}

}  // namespace accelerate
}  // namespace chorus
