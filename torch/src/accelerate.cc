// Accelerate-style operations on the default group (the walkers are in collections/local.cc).
#include "chorus/accelerate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "collections/collective.h"
#include "objects/collective.h"
#include "tensor_util.h"

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
}  // namespace chorus
