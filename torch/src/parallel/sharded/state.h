// The per-module state of one ShardedDataParallel (FSDP2's FSDPState): its sharded parameters
// (param.h), its units (unit.h), the training state, and the order in which units are gathered and
// reduced (Note [Sharded units] in state.cc, Note [Sharded backward] in backward.cc).
#pragma once

#include <torch/nn/module.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/sharded.h"
#include "groups/placement.h"
#include "parallel/grad_hooks.h"
#include "parallel/sharded/engine.h"
#include "parallel/sharded/param.h"
#include "parallel/sharded/unit.h"

namespace chorus::detail {

class ShardedState final : public DataParallelEngine,
                           public ShardOwner,
                           public std::enable_shared_from_this<ShardedState> {
 public:
  enum class TrainingState {
    Idle,      // between steps (ShardGradOp may keep the last forward's units for its backward)
    Forward,   // inside forward(fn)
    Backward,  // a backward pass reached this module and its end has not been handled yet
  };

  ShardedState(std::shared_ptr<ProcessGroup> group, ShardingStrategy strategy, bool prefetch);
  ~ShardedState();

  // Construction: takes the module's parameters (rank 0's values) and units.
  void shard(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& units);
  // Elastic recovery (Note [Elastic in process]): shards the same parameters over `group`, the
  // group that replaced this one's. The module's tensors and the shard tensors stay the same
  // objects (the optimizer's references hold), sized for the new group; their values are zero
  // until a commit is loaded into them. A forward or backward that the old group's failure broke
  // off is dropped with it. Collective over `group`. InvalidArgument inside a backward pass or
  // while a GatheredParameters holds a parameter.
  void regroup(std::shared_ptr<ProcessGroup> group);

  // An operator is about to use parameter i (Note [Sharded parameters]): gathers its unit or throws.
  void touch(size_t i, const std::string& op) override;
  // Placement's view of parameter i (groups/placement.h).
  const std::shared_ptr<ProcessGroup>& shard_group() const override { return ctx_.group; }
  Shard shard_of(size_t i) const override {
    const ShardedParam& p = *params_[i];
    return {p.numel, p.shard_numel, p.mine, p.shard};
  }

  void begin_forward() override;
  void end_forward(bool ok) override;

  // Backward (backward.cc).
  void on_grad_ready(size_t i);
  void finalize_backward();
  bool set_sync(bool sync) override;

  // GatheredParameters (gathered.cc): indices must be free of holders (checked first).
  std::string hold_problem(const std::vector<size_t>& indices);
  void hold(const std::vector<size_t>& indices);
  // Re-shards; with a modifier its values first become everyone's. Returns "" or the names of
  // parameters edited in place without a modifier (on which ranks).
  std::string release(const std::vector<size_t>& indices, std::optional<int> modifier_rank);
  // Gives the parameters back on this rank alone (an entry that failed half way).
  void drop(const std::vector<size_t>& indices);

  std::vector<at::Tensor> parameters() override;  // the shards
  torch::OrderedDict<std::string, at::Tensor> named_parameters() override;
  torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& module) override;
  ShardedDataParallel::MemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  std::vector<std::pair<std::string, std::vector<std::string>>> unit_layout() const override;

  const ShardedParam& param(size_t i) const { return *params_[i]; }
  ShardingStrategy strategy() const { return strategy_; }
  // Checkpoints: before shards are overwritten, no full copy may be alive (InvalidArgument during
  // forward, backward or a GatheredParameters); the kept ones (ShardGradOp) are dropped.
  void prepare_load();
  // Made-order of the ShardedDataParallels of this process (the same on every rank that makes
  // them in the same order): GatheredParameters' canonical order.
  uint64_t id() const { return id_; }
  ProcessGroup& group() { return *ctx_.group; }
  const std::shared_ptr<ProcessGroup>& group_ptr() const override { return ctx_.group; }
  bool busy() const;  // in forward or a backward
  // An error a GatheredParameters destructor could not throw: thrown by the next forward or
  // GatheredParameters.
  void defer_error(std::exception_ptr e);
  void rethrow_deferred();

 private:
  // shard()'s steps.
  std::vector<size_t> assign_units(torch::nn::Module& module,
                                   const std::vector<std::shared_ptr<torch::nn::Module>>& units);
  void add_param(const std::string& name, const at::Tensor& p, size_t unit);
  void adopt(std::unique_ptr<ShardedParam> param);  // makes its tensor a sharded parameter of ours
  void arm();                                       // gradient hooks and the arena, once the params are in
  void check_idle(const char* what);                // InvalidArgument while busy or held
  void check_not_held(const char* what);            // InvalidArgument while a GatheredParameters holds one
  bool agree_regrouping(bool mine);                 // Note [Joining a sharded job]: does any rank regroup?

  // Callers hold mu_.
  bool reshards_after_forward() const { return strategy_ == ShardingStrategy::FullShard; }
  void enter_backward();           // the first hook or gather of a backward pass
  void abandon_backward();         // a backward that never reached its end
  void launch_ready_reductions();  // in reduction order, as far as units are complete
  void reset_backward();
  void free_all();

  const uint64_t id_;
  const ShardingStrategy strategy_;
  const bool prefetch_;
  bool joining_ = false;  // made while survivors regroup: values come from a commit (Note [Joining a sharded job])
  ShardingContext ctx_;
  std::vector<std::unique_ptr<ShardedParam>> params_;
  std::vector<ShardedUnit> units_;  // units_[0]: the root unit
  GradReadyHooks hooks_;            // on_grad_ready after each gradient (backward.cc)

  mutable std::mutex mu_;
  TrainingState state_ = TrainingState::Idle;
  bool sync_ = true;  // no_sync sets it false
  // Forward: units in the order this forward first used them, and the previous forward's order
  // (prefetch follows it).
  std::vector<size_t> forward_order_, last_order_;
  std::vector<char> seen_in_forward_;
  std::optional<size_t> current_;  // the unit forward used last
  // Backward: reductions start in this order (the reverse of the forward's, then units it did not
  // use), each once every unit before it started.
  std::vector<size_t> reduction_order_;
  size_t next_reduction_ = 0;
  std::exception_ptr deferred_;
};

// The engine behind a Shard placement: ShardedState is the one ShardOwner.
inline std::shared_ptr<ShardedState> sharded_state_of(const Placement& p) {
  return std::dynamic_pointer_cast<ShardedState>(p.owner);
}

}  // namespace chorus::detail
