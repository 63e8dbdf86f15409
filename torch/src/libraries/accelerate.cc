// Accelerate's operations: those on the default group, then the local walkers over tensors in
// lists, tuples and dicts (no communication; those that map leaves walk with collections/tree.h).
#include "chorus/accelerate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <mutex>

#include "chorus/core/error.h"
#include "groups/tensor_util.h"
#include "parallel/collections/collective.h"
#include "parallel/collections/tree.h"
#include "parallel/objects/collective.h"

namespace chorus {

using detail::concat;

namespace {

// The default group, or null with one process and no group.
std::shared_ptr<ProcessGroup> maybe_default() { return is_initialized() ? default_group() : nullptr; }

void check_single_source(int src, const char* what) {
  if (src != 0)
    throw InvalidArgument(concat(what, ": process ", src, " does not exist: this is a single process (rank 0)"));
}

}  // namespace

inline namespace accelerate {

void broadcast(at::Tensor& t, int from_process) {
  if (auto g = maybe_default()) return g->broadcast_(t, from_process);
  check_single_source(from_process, "broadcast");
}

std::optional<at::Tensor> gather(const at::Tensor& t) {
  auto g = maybe_default();
  if (!g) return t.dim() ? t : t.reshape({1});
  auto out = detail::gather_collection(*g, t, 0, "gather");
  if (!out) return std::nullopt;
  return out->toTensor();
}

c10::IValue gather(const c10::IValue& data) {
  auto g = maybe_default();
  if (!g)
    return recursively_apply([](const at::Tensor& t) -> c10::IValue { return t.dim() ? t : t.reshape({1}); }, data);
  return detail::gather_collection(*g, data, 0, "gather").value_or(c10::IValue());
}

at::Tensor reduce(at::Tensor& t, ReduceOp op) {
  if (auto g = maybe_default())
    g->all_reduce_(t, op);
  else if (auto why = detail::tensor_problem(t, op); !why.empty())
    throw InvalidArgument(concat("reduce: ", why));
  return t;
}

at::Tensor reduce(at::Tensor& t, std::string_view reduction) {
  if (reduction == "none") return t;
  return reduce(t, parse_reduce_op(reduction));
}

at::Tensor pad_across_processes(const at::Tensor& t, int64_t dim, double pad_index, bool pad_first) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  const bool applies = t.defined() && d >= 0 && d < t.dim();
  auto g = maybe_default();
  if (!g) return t;
  // Every rank joins the size exchange, including those whose tensor has no such dim.
  int64_t mine = applies ? t.size(d) : -1;
  std::vector<int64_t> sizes(size_t(g->size()));
  g->communicator().all_gather(&mine, sizes.data(), 1, DataType::Int64);
  if (!applies) return t;
  int64_t longest = 0;
  for (int64_t s : sizes) longest = std::max(longest, s);
  if (longest == mine) return t;
  auto shape = t.sizes().vec();
  shape[size_t(d)] = longest;
  at::Tensor out = at::full(shape, pad_index, t.options());
  out.narrow(d, pad_first ? longest - mine : 0, mine).copy_(t);
  return out;
}

void broadcast_object_list(std::vector<c10::IValue>& objects, int from_process) {
  auto g = maybe_default();
  if (!g) return check_single_source(from_process, "broadcast_object_list");
  auto list = detail::broadcast_value(
      *g, from_process,
      [&] {
        c10::impl::GenericList l(c10::AnyType::get());
        for (const auto& o : objects) l.push_back(o);
        return c10::IValue(l);
      },
      "broadcast_object_list");
  if (g->rank() != from_process) objects = list.toList().vec();
}

std::optional<std::vector<c10::IValue>> gather_object(const c10::IValue& obj) {
  auto g = maybe_default();
  if (!g) return std::vector<c10::IValue>{obj};
  return detail::gather_values(
      *g, 0, [&] { return obj; }, "gather_object");
}

std::vector<c10::IValue> all_gather_object(const c10::IValue& obj) {
  auto g = maybe_default();
  if (!g) return {obj};
  return *detail::gather_values(
      *g, -1, [&] { return obj; }, "all_gather_object");
}

}  // namespace accelerate

c10::IValue detail::broadcast_default(const c10::IValue& obj, int src, const char* what) {
  auto g = maybe_default();
  if (!g) {
    check_single_source(src, what);
    return obj;
  }
  return broadcast_value(
      *g, src, [&] { return obj; }, what);
}

inline namespace accelerate {

void wait_for_everyone() {
  if (auto g = maybe_default()) g->barrier();
}

void synchronize_rng_states(const std::vector<std::string>& rng_types, std::optional<at::Generator> generator) {
  auto g = maybe_default();
  for (const auto& type : rng_types) {
    std::string why;
    at::Generator gen;
    if (type == "torch" || type == "cpu")
      gen = at::detail::getDefaultCPUGenerator();
    else if (type == "generator" && generator)
      gen = *generator;
    else if (type == "generator")
      why = "rng type 'generator' needs the generator argument";
    else if (type == "cuda" || type == "xla" || type == "npu" || type == "mlu" || type == "xpu" || type == "hpu" ||
             type == "musa")
      why = concat("rng type '", type, "' needs a device this CPU build of chorus does not drive");
    else
      why = concat("unknown rng type '", type, "' (use torch, cpu or generator)");
    if (!why.empty()) {
      if (g) g->communicator().reject("synchronize_rng_states", why);
      throw InvalidArgument("synchronize_rng_states: " + why);
    }
    if (!g) continue;
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    g->broadcast_(state, 0);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

void set_seed(uint64_t seed, bool device_specific) {
  if (device_specific) seed += uint64_t(environment().rank);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace accelerate
// ---- the local walkers ----

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
  // Walks the first collection; `at` follows each collection to the same place (dicts by key, as
  // Accelerate's does), and each tensor leaf is concatenated with its partners.
  struct Zip : detail::tree::Visitor {
    std::vector<c10::IValue> at;               // per collection: the value at the walk's place
    std::vector<std::vector<c10::IValue>> up;  // `at` of each open container
    std::vector<c10::IValue> joined;           // per leaf of the first, in leaf order
    int64_t dim;
    bool is_leaf(const c10::IValue& v) const { return !detail::tree::is_container(v); }
    void leaf(const c10::IValue&) {
      std::vector<at::Tensor> tensors;
      for (const auto& d : at) {
        if (!d.isTensor())
          throw InvalidArgument(concat("concatenate: found a ", d.type()->annotation_str(),
                                       " where only tensors (in lists, tuples and dicts) can be concatenated"));
        tensors.push_back(d.toTensor());
      }
      joined.emplace_back(at::cat(tensors, dim));
    }
    void open(const c10::IValue& v) {
      const size_t n = v.isList()    ? v.toListRef().size()
                       : v.isTuple() ? v.toTupleRef().elements().size()
                                     : v.toGenericDict().size();
      for (const auto& d : at) {
        const bool same = v.isGenericDict()
                              ? d.isGenericDict() && d.toGenericDict().size() == n
                              : (d.isList() || d.isTuple()) && d.isList() == v.isList() &&
                                    (d.isList() ? d.toListRef().size() : d.toTupleRef().elements().size()) == n;
        if (!same) throw InvalidArgument("concatenate: the collections differ in structure (kind or length)");
      }
      up.push_back(at);
    }
    void child(size_t i, const c10::IValue* key) {
      for (size_t k = 0; k < at.size(); ++k) {
        const c10::IValue& d = up.back()[k];
        if (key && !d.toGenericDict().contains(*key))
          throw InvalidArgument("concatenate: the collections differ in structure (kind or length)");
        at[k] = key ? d.toGenericDict().at(*key) : d.isList() ? d.toListRef()[i] : d.toTupleRef().elements()[i];
      }
    }
    void close(const c10::IValue&) { up.pop_back(); }
  } zip;
  zip.at = data;
  zip.dim = dim;
  detail::tree::walk(data[0], zip);
  return detail::tree::map_leaves(data[0], local_leaf,
                                  [&](const c10::IValue&, size_t i) -> c10::IValue { return zip.joined[i]; });
}

c10::IValue slice_tensors(const c10::IValue& data, int64_t start, int64_t stop) {
  return map_tensors(
      data, [&](const at::Tensor& t) -> c10::IValue { return t.dim() ? t.slice(0, start, stop) : t; }, false,
      "slice_tensors");
}

c10::IValue send_to_device(const c10::IValue& data, const at::Device& device, bool non_blocking,
                           const std::vector<std::string>& skip_keys) {
  // A dict value under a skipped key stays as it is, whatever it holds (at every depth, as Accelerate's).
  auto skipped = [&](const c10::IValue* key) {
    return key && key->isString() &&
           std::find(skip_keys.begin(), skip_keys.end(), key->toStringRef()) != skip_keys.end();
  };
  return detail::tree::map_leaves(
      data, [&](const c10::IValue& v, const c10::IValue* key) { return skipped(key) || local_leaf(v); },
      [&](const c10::IValue& leaf, size_t, const c10::IValue* key) -> c10::IValue {
        return leaf.isTensor() && !skipped(key) ? c10::IValue(leaf.toTensor().to(device, non_blocking)) : leaf;
      });
}

namespace {

// The first leaf in leaf order (Accelerate follows the first item of every list and dict).
struct FirstLeaf : detail::tree::Visitor {
  bool found = false;
  c10::IValue value;
  const char* empty = nullptr;  // the kind of an empty container reached before any leaf
  bool is_leaf(const c10::IValue& v) const { return !detail::tree::is_container(v); }
  void leaf(const c10::IValue& v) {
    found = true;
    value = v;
  }
  void open(const c10::IValue& v) {
    const bool none = v.isGenericDict() ? v.toGenericDict().empty()
                      : v.isList()      ? v.toListRef().empty()
                                        : v.toTupleRef().elements().empty();
    if (!none) return;
    empty = v.isGenericDict() ? "dict" : "list or tuple";
    found = true;
  }
  bool done() const { return found; }
};

}  // namespace

int64_t find_batch_size(const c10::IValue& data) {
  FirstLeaf first;
  detail::tree::walk(data, first);
  if (first.empty) throw InvalidArgument(concat("find_batch_size: the data is an empty ", first.empty));
  if (!first.value.isTensor())
    throw InvalidArgument(concat("find_batch_size: found a ", first.value.type()->annotation_str(),
                                 " where a tensor (or a list, tuple or dict starting with one) was expected"));
  const auto& t = first.value.toTensor();
  if (t.dim() == 0) throw InvalidArgument("find_batch_size: the first tensor is 0-d and has no batch dimension");
  return t.size(0);
}

std::optional<at::Device> find_device(const c10::IValue& data) {
  struct FirstTensor : detail::tree::Visitor {
    std::optional<at::Device> device;
    bool is_leaf(const c10::IValue& v) const { return v.isTensor(); }
    void leaf(const c10::IValue& v) { device = v.toTensor().device(); }
    bool done() const { return device.has_value(); }
  } first;
  detail::tree::walk(data, first);
  return first.device;
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
