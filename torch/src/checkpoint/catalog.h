// What a checkpoint holds, as slots: every tensor of a CheckpointState with its name, shape, dtype
// and how the ranks hold it (Note [Checkpoint layout] in catalog.cc), plus the items' other values.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
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

// The elements [begin, end) of the flattened tensor that `rank` of `world` holds (Sharded) or
// writes (Split: parts of ceil(N/W); Replicated: rank 0 all of them).
std::pair<int64_t, int64_t> part_of(const Slot& s, int rank, int world);

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
  Catalog catalog_;
  const CheckpointState& state_;
  std::vector<std::shared_ptr<OptimizerItem>> optimizers_;
  std::map<std::string, at::Tensor> in_place_;  // optimizer state filled where it was
};

}  // namespace chorus::detail::checkpoint
