// ShardedDataParallel: the public face of ShardedState (FullShard, ShardGradOp) and of
// DistributedDataParallel (NoShard).
#include "chorus/sharded.h"

#include "sharded/state.h"
#include "tensor_util.h"

namespace chorus {

using detail::concat;

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, ShardedOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  if (!module_) throw InvalidArgument("ShardedDataParallel: the module is null");
  group_ = options_.group ? options_.group : default_group();
  if (options_.strategy == ShardingStrategy::NoShard) {
    DDPOptions ddp;
    ddp.group = group_;
    ddp.find_unused_parameters = true;  // as the sharded strategies: a parameter without a gradient counts as zero
    replicas_ = std::make_unique<DistributedDataParallel>(module_, ddp);
    return;
  }
  state_ = std::make_shared<detail::ShardedState>(group_, options_.strategy, options_.prefetch);
  state_->shard(*module_, options_.units);
}

ShardedDataParallel::~ShardedDataParallel() = default;

ShardedDataParallel::ForwardScope::ForwardScope(ShardedDataParallel& s) : self(s) {
  if (self.state_) self.state_->begin_forward();
}
ShardedDataParallel::ForwardScope::~ForwardScope() {
  if (self.state_ && !ok) self.state_->end_forward(false);
}
void ShardedDataParallel::ForwardScope::finished() {
  ok = true;
  if (self.state_) self.state_->end_forward(true);
}

std::vector<at::Tensor> ShardedDataParallel::parameters() {
  if (state_) return state_->shards();
  return module_->parameters(true);
}

torch::OrderedDict<std::string, at::Tensor> ShardedDataParallel::named_parameters() {
  if (state_) return state_->named_shards();
  return module_->named_parameters(true);
}

NoSyncGuard ShardedDataParallel::no_sync() {
  if (replicas_) return replicas_->no_sync();
  return NoSyncGuard(this);
}

torch::OrderedDict<std::string, at::Tensor> ShardedDataParallel::full_state_dict() {
  if (state_) return state_->full_state_dict(*module_);
  group_->barrier();  // collective under every strategy
  torch::OrderedDict<std::string, at::Tensor> out;
  if (group_->rank() != 0) return out;
  at::NoGradGuard no_grad;
  for (const auto& item : module_->named_parameters(true)) out.insert(item.key(), item.value().detach().clone());
  for (const auto& item : module_->named_buffers(true)) out.insert(item.key(), item.value().detach().clone());
  return out;
}

ShardedDataParallel::MemoryStats ShardedDataParallel::memory_stats() const {
  if (state_) return state_->memory_stats();
  MemoryStats m;
  for (const auto& p : module_->parameters(true)) {
    m.shard_bytes += p.numel() * int64_t(p.element_size());
    if (p.grad().defined()) m.shard_grad_bytes += p.grad().numel() * int64_t(p.grad().element_size());
  }
  return m;
}

void ShardedDataParallel::reset_peak_memory() {
  if (state_) state_->reset_peak_memory();
}

std::vector<std::pair<std::string, std::vector<std::string>>> ShardedDataParallel::unit_layout() const {
  if (state_) return state_->unit_layout();
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(true)) names.push_back(item.key());
  return {{"", names}};
}

NoSyncGuard::NoSyncGuard(ShardedDataParallel* sdp) {
  if (!sdp) return;
  if (sdp->replicas_) {
    NoSyncGuard replicas = sdp->replicas_->no_sync();
    restore_ = std::move(replicas.restore_);
    replicas.restore_ = nullptr;
    return;
  }
  std::shared_ptr<detail::ShardedState> state = sdp->state_;
  const bool previous = state->set_sync(false);
  restore_ = [state, previous] { state->set_sync(previous); };
}

std::vector<std::shared_ptr<torch::nn::Module>> units_of_size(const std::shared_ptr<torch::nn::Module>& module,
                                                              int64_t min_params) {
  if (!module) throw InvalidArgument("units_of_size: the module is null");
  // Bottom-up: a module is a unit when the parameters not claimed by units below it reach min_params.
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  std::function<int64_t(const std::shared_ptr<torch::nn::Module>&, bool)> visit =
      [&](const std::shared_ptr<torch::nn::Module>& m, bool is_root) -> int64_t {
    int64_t unclaimed = 0;
    for (const auto& p : m->parameters(/*recurse=*/false)) unclaimed += p.numel();
    for (const auto& child : m->children()) unclaimed += visit(child, false);
    if (!is_root && unclaimed >= min_params) {
      units.push_back(m);
      return 0;
    }
    return unclaimed;
  };
  visit(module, true);
  return units;
}

}  // namespace chorus
