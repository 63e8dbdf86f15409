// What a checkpoint holds, as slots: every tensor of a CheckpointState with its name, shape, dtype
// and how the ranks hold it (Note [Checkpoint layout] in catalog.cc), plus the items' other values.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/checkpoint.h"

namespace chorus::detail::checkpoint {

enum class Layout : int64_t {
  Replicated = 0,  // rank 0's values count; every rank may hold them
  Split = 1,       // equal on every rank (DDP replicas): written in W parts, one per rank
  Sharded = 2,     // each rank holds its range only (ShardedDataParallel's shards)
};

struct Slot {
  std::string key;  // "model/l1.weight", "optimizer/state/model.l1.weight/exp_avg"
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  Layout layout = Layout::Replicated;
  int64_t shard_numel = 0;  // Sharded: S; rank r holds elements [r*S, min(N, (r+1)*S))
  // Save: the values (Sharded: this rank's S elements; else the whole tensor). Load: where they
  // go, or undefined when the loader makes the tensor (optimizer state).
  at::Tensor local;
};

// The names a checkpoint gives its tensors (Note [Checkpoint layout]), in one place.
namespace keys {
// Every key of an item starts with "<item>/" (item names have no '/').
inline std::string item_prefix(const std::string& item) { return item + "/"; }
// A module's parameter or buffer: "<item>/<name in the module>".
inline std::string module_tensor(const std::string& item, const std::string& name) { return item_prefix(item) + name; }
// How an optimizer names a parameter: after its module item ("<item>.<name in the module>"), or by
// position for a parameter no module of the state holds ("<optimizer item>.group<g>.param<k>").
inline std::string param_ref(const std::string& module_item, const std::string& name) {
  return module_item + "." + name;
}
inline std::string positional_ref(const std::string& optimizer_item, size_t group, size_t index) {
  return optimizer_item + ".group" + std::to_string(group) + ".param" + std::to_string(index);
}
// An optimizer's state tensors of one parameter: "<item>/state/<param ref>/<state name>", all
// sharing this prefix.
inline std::string optimizer_state_prefix(const std::string& item, const std::string& ref) {
  return item_prefix(item) + "state/" + ref + "/";
}
}  // namespace keys

// The elements [begin, end) of the flattened tensor that `rank` of `world` holds (Sharded) or
// writes (Split: parts of ceil(N/W); Replicated: rank 0 all of them).
std::pair<int64_t, int64_t> part_of(const Slot& s, int rank, int world);

// A parameter as a checkpoint sees it, by the tensor its optimizer holds (a shard, for a sharded one).
struct ParamInfo {
  std::string ref;                     // keys::param_ref or keys::positional_ref
  Layout layout = Layout::Replicated;  // of the parameter (and its optimizer state)
  int64_t shard_numel = 0;
  std::optional<std::vector<int64_t>> shape;  // a module's parameter: its full shape
};
using ParamInfos = std::unordered_map<const c10::TensorImpl*, ParamInfo>;

// The things a save or load works on.
struct Catalog {
  std::vector<Slot> slots;
  std::vector<std::pair<std::string, std::string>>
      items;  // name, kind ("module:full_shard", "optimizer:Adam", "value")
  c10::impl::GenericDict objects{c10::StringType::get(), c10::AnyType::get()};  // item -> its non-tensor state
  bool sharded = false;                                                         // a sharded module is in it
};

// Save: every tensor with its values, the optimizers' options and steps, the values.
Catalog catalog_for_save(const CheckpointState& state);

// Load: the slots to fill (optimizer slots for the state tensors the checkpoint has, which `saved`
// lists by key with their dtypes; an optimizer's existing state tensors are filled in place when
// they fit), then finish() applies what is not a tensor. Throws InvalidArgument for state
// that cannot be loaded now (a sharded module in forward, an optimizer type chorus cannot restore).
class LoadCatalog {
 public:
  LoadCatalog(const CheckpointState& state, const std::map<std::string, at::ScalarType>& saved);
  Catalog& catalog() { return catalog_; }
  // What makes the checkpoint's non-tensor state (`objects`) unfit for this state, or "".
  std::string problem(const c10::impl::GenericDict& objects) const;
  // `loaded`: tensors of slots without a target, by key. `objects`: the checkpoint's.
  void finish(const c10::impl::GenericDict& objects, std::map<std::string, at::Tensor>& loaded);

 private:
  struct OptimizerItem;
  void add_optimizer(const std::string& name, torch::optim::Optimizer& o, const ParamInfos& params,
                     const std::map<std::string, at::ScalarType>& saved);
  Catalog catalog_;
  const CheckpointState& state_;
  std::vector<std::shared_ptr<OptimizerItem>> optimizers_;
  std::map<std::string, at::Tensor> in_place_;  // optimizer state filled where it was
};

}  // namespace chorus::detail::checkpoint
