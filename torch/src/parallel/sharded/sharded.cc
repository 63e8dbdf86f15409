// ShardedDataParallel: the public face of its engine (sharded/engine.h): ShardedState for
// FullShard and ShardGradOp, a DistributedDataParallel's replicas for NoShard.
#include "chorus/sharded.h"

#include "groups/tensor_util.h"
#include "parallel/sharded/state.h"

namespace chorus {

using detail::concat;

namespace {

// NoShard: a DistributedDataParallel keeps the parameters replicated; one unit, nothing gathered.
class ReplicatedEngine final : public detail::DataParallelEngine {
 public:
  ReplicatedEngine(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group)
      : module_(module), group_(group), ddp_(std::move(module), options(std::move(group))) {}

  void begin_forward() override {}
  void end_forward(bool) override {}
  std::vector<at::Tensor> parameters() override { return module_->parameters(true); }
  torch::OrderedDict<std::string, at::Tensor> named_parameters() override { return module_->named_parameters(true); }

  bool set_sync(bool sync) override {
    const bool previous = !no_sync_;
    if (sync)
      no_sync_.reset();
    else if (!no_sync_)
      no_sync_ = std::make_unique<NoSyncGuard>(ddp_.no_sync());
    return previous;
  }

  torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& module) override {
    ddp_.group().barrier();  // collective under every strategy
    torch::OrderedDict<std::string, at::Tensor> out;
    if (ddp_.group().rank() != 0) return out;
    at::NoGradGuard no_grad;
    for (const auto& item : module.named_parameters(true)) out.insert(item.key(), item.value().detach().clone());
    for (const auto& item : module.named_buffers(true)) out.insert(item.key(), item.value().detach().clone());
    return out;
  }

  ShardedDataParallel::MemoryStats memory_stats() const override {
    ShardedDataParallel::MemoryStats m;
    for (const auto& p : module_->parameters(true)) {
      m.shard_bytes += detail::bytes_of(p);
      m.shard_grad_bytes += detail::bytes_of(p.grad());
    }
    return m;
  }
  void reset_peak_memory() override {}
  const std::shared_ptr<ProcessGroup>& group_ptr() const override { return group_; }

  std::vector<std::pair<std::string, std::vector<std::string>>> unit_layout() const override {
    std::vector<std::string> names;
    for (const auto& item : module_->named_parameters(true)) names.push_back(item.key());
    return {{"", names}};
  }

 private:
  static DDPOptions options(std::shared_ptr<ProcessGroup> group) {
    DDPOptions ddp;
    ddp.group = std::move(group);
    ddp.find_unused_parameters = true;  // as the sharded strategies: a parameter without a gradient counts as zero
    return ddp;
  }
  std::shared_ptr<torch::nn::Module> module_;  // (DDP's module() is not const)
  std::shared_ptr<ProcessGroup> group_;
  DistributedDataParallel ddp_;
  std::unique_ptr<NoSyncGuard> no_sync_;  // while synchronization is off
};

}  // namespace

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, ShardedOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  if (!module_) throw InvalidArgument("ShardedDataParallel: the module is null");
  std::shared_ptr<ProcessGroup> group = options_.group ? options_.group : default_group();
  if (options_.strategy == ShardingStrategy::NoShard) {
    engine_ = std::make_shared<ReplicatedEngine>(module_, group);
    return;
  }
  auto state = std::make_shared<detail::ShardedState>(group, options_.strategy, options_.prefetch);
  state->shard(*module_, options_.units);
  engine_ = std::move(state);
}

ShardedDataParallel::~ShardedDataParallel() = default;

ShardedDataParallel::ForwardScope::ForwardScope(ShardedDataParallel& s) : self(s) { self.engine_->begin_forward(); }
ShardedDataParallel::ForwardScope::~ForwardScope() {
  if (!ok) self.engine_->end_forward(false);
}
void ShardedDataParallel::ForwardScope::finished() {
  ok = true;
  self.engine_->end_forward(true);
}

std::vector<at::Tensor> ShardedDataParallel::parameters() { return engine_->parameters(); }

ProcessGroup& ShardedDataParallel::group() { return *engine_->group_ptr(); }

torch::OrderedDict<std::string, at::Tensor> ShardedDataParallel::named_parameters() {
  return engine_->named_parameters();
}

NoSyncGuard ShardedDataParallel::no_sync() { return NoSyncGuard(this); }

torch::OrderedDict<std::string, at::Tensor> ShardedDataParallel::full_state_dict() {
  return engine_->full_state_dict(*module_);
}

ShardedDataParallel::MemoryStats ShardedDataParallel::memory_stats() const { return engine_->memory_stats(); }

void ShardedDataParallel::reset_peak_memory() { engine_->reset_peak_memory(); }

std::vector<std::pair<std::string, std::vector<std::string>>> ShardedDataParallel::unit_layout() const {
  return engine_->unit_layout();
}

NoSyncGuard::NoSyncGuard(ShardedDataParallel* sdp) {
  if (!sdp) return;
  std::shared_ptr<detail::DataParallelEngine> engine = sdp->engine_;
  const bool previous = engine->set_sync(false);
  restore_ = [engine, previous] { engine->set_sync(previous); };
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
