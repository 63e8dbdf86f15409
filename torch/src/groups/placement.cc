// Note [Placements]
// A tensor's placement is what DTensor calls its placements, for the parameters chorus's wrappers
// hold: Plain, Replica (a DistributedDataParallel's parameter: every rank of its group holds the
// same values) or Shard (a ShardedDataParallel's parameter: rank r holds elements
// [r*S, min(N, (r+1)*S)) of the flattened parameter, S = ceil(N / W), in a tensor of S elements
// padded at the end). The wrappers register their parameters here for as long as they live:
// replicas by TensorImpl, shards by storage, so that a view of a sharded parameter (an operator's
// argument) is known too. Everything that must treat the kinds differently (GatheredParameters,
// a checkpoint's catalog, the sharded parameters' kernel) switches on placement_of.
#include "groups/placement.h"

#include <mutex>
#include <unordered_map>

namespace chorus::detail {

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const c10::StorageImpl*, std::pair<std::weak_ptr<ShardOwner>, size_t>> shards;
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<ProcessGroup>> replicas;
};
Registry& registry() {
  static Registry* r = new Registry;  // outlives every static destructor that might still free a module
  return *r;
}

}  // namespace

Placement placement_of(const at::Tensor& t) {
  Placement out;
  if (!t.defined()) return out;
  Registry& r = registry();
  if (t.has_storage() && t.key_set().has(c10::DispatchKey::PrivateUse3)) {  // only sharded storages have the key
    std::shared_ptr<ShardOwner> owner;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.shards.find(t.storage().unsafeGetStorageImpl());
      if (it != r.shards.end()) {
        owner = it->second.first.lock();
        index = it->second.second;
      }
    }
    if (!owner) return out;
    ShardOwner::Shard s = owner->shard_of(index);
    out.kind = Placement::Kind::Shard;
    out.group = owner->shard_group();
    out.index = index;
    out.numel = s.numel;
    out.shard = s.shard;
    out.mine = s.mine;
    out.local = std::move(s.local);
    out.owner = std::move(owner);
    return out;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.replicas.find(t.unsafeGetTensorImpl());
  if (it == r.replicas.end()) return out;
  if ((out.group = it->second.lock())) out.kind = Placement::Kind::Replica;
  return out;
}

void register_shard(const c10::StorageImpl* storage, const std::shared_ptr<ShardOwner>& owner, size_t index) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().shards[storage] = {owner, index};
}

void forget_shard(const c10::StorageImpl* storage) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().shards.erase(storage);
}

void register_replicas(const std::vector<at::Tensor>& params, const std::shared_ptr<ProcessGroup>& group) {
  std::lock_guard<std::mutex> lock(registry().mu);
  for (const auto& p : params) registry().replicas[p.unsafeGetTensorImpl()] = group;
}

void forget_replicas(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(registry().mu);
  for (const auto& p : params) registry().replicas.erase(p.unsafeGetTensorImpl());
}

}  // namespace chorus::detail
