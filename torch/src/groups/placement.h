// How the ranks hold a tensor: the one answer the torch layer gives to "is this parameter plain,
// replicated by a DDP, or sharded, and which part is mine" (Note [Placements] in placement.cc).
// GatheredParameters, checkpoints and the sharded parameters' kernel all ask it here. Placement
// knows the engines that hold parameters only through what they register: a replica's group, and
// a shard's owner (ShardOwner, which the sharded engine implements).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/process_group.h"

namespace chorus::detail {

// The one rule for where a sharded parameter's elements lie (FSDP2's even Shard(0) of the
// flattened parameter): N elements over W ranks, each rank holding S = ceil(N / W) of them, rank
// r's real ones being [r*S, min(N, (r+1)*S)) of the flat parameter and the rest of its S padding.
inline int64_t shard_numel(int64_t numel, int world) { return (numel + world - 1) / world; }

struct ShardRange {
  int64_t begin = 0, end = 0;  // of the flat parameter
  int64_t size() const { return end - begin; }
};

// Rank `rank`'s real elements of a parameter of `numel` elements in shards of `shard` elements.
inline ShardRange shard_range(int64_t numel, int64_t shard, int rank) {
  const int64_t begin = std::min(numel, rank * shard);
  return {begin, std::min(numel, begin + shard)};
}

// What placement asks of the engine that owns sharded parameters (parallel/sharded/state.h's
// ShardedState implements it).
class ShardOwner {
 public:
  struct Shard {
    int64_t numel = 0, shard = 0;  // N and S
    ShardRange mine;               // this rank's real elements
    at::Tensor local;              // this rank's S elements: the leaf its optimizer holds
  };
  virtual ~ShardOwner() = default;
  virtual const std::shared_ptr<ProcessGroup>& shard_group() const = 0;
  virtual Shard shard_of(size_t index) const = 0;
  // An operator named `op` is about to use parameter `index`: gathers it or throws (Note [Sharded
  // parameters]).
  virtual void touch(size_t index, const std::string& op) = 0;
};

struct Placement {
  enum class Kind {
    Plain,    // no wrapper holds it: each rank's own tensor
    Replica,  // a parameter of a live DistributedDataParallel: equal on every rank of `group`
    Shard,    // a parameter (or a view of one) of a live ShardedDataParallel
  };
  Kind kind = Kind::Plain;
  std::shared_ptr<ProcessGroup> group;  // Replica, Shard: the ranks that hold it together
  // Shard only.
  std::shared_ptr<ShardOwner> owner;
  size_t index = 0;              // the parameter's index in its owner
  int64_t numel = 0, shard = 0;  // N and S
  ShardRange mine;               // this rank's real elements
  at::Tensor local;              // this rank's S elements: the leaf its optimizer holds
};

Placement placement_of(const at::Tensor& t);

// A sharded parameter's storage (every view of the parameter shares it), while its owner lives.
void register_shard(const c10::StorageImpl* storage, const std::shared_ptr<ShardOwner>& owner, size_t index);
void forget_shard(const c10::StorageImpl* storage);
// A DistributedDataParallel's parameters, while it lives.
void register_replicas(const std::vector<at::Tensor>& params, const std::shared_ptr<ProcessGroup>& group);
void forget_replicas(const std::vector<at::Tensor>& params);

}  // namespace chorus::detail
