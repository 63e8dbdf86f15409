// The machinery of one ShardedDataParallel: shards, units, gathering and freeing, the gradient
// reduction (Note [Sharded units] in state.cc, Note [Sharded backward] in backward.cc).
#pragma once

#include <torch/nn/module.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/sharded.h"
#include "grad_hooks.h"

namespace chorus::detail {

class ShardedState : public std::enable_shared_from_this<ShardedState> {
 public:
  struct Param {
    std::string name;
    std::vector<std::string> aliases;              // a tied parameter's other names in the module
    at::Tensor param;                              // the module's tensor, now a sharded parameter
    c10::intrusive_ptr<c10::StorageImpl> storage;  // its storage: empty, or the full values
    int64_t numel = 0, shard_numel = 0;            // N and S = ceil(N / W)
    at::Tensor shard;                              // this rank's S elements (a leaf: the optimizer's)
    at::Tensor full;                               // W * S gathered elements while the storage shows them
    at::Tensor incoming;                           // where a prefetch in flight lands
    std::shared_ptr<TensorWork> gathering;         // that prefetch
    at::Tensor reduce_in, reduce_out;              // this backward's reduction: padded full gradient, shard
    std::shared_ptr<TensorWork> reduction;
    size_t unit = 0;
    bool held = false;   // by a GatheredParameters
    bool ready = false;  // its gradient arrived in this backward
    bool edited_check = false;
    int64_t version_at_hold = 0;
  };
  struct Unit {
    std::string name;             // in the module; "" for the root unit
    std::vector<size_t> params;   // all of them
    std::vector<size_t> reduced;  // those that get gradients, in reduction-buffer order
    size_t ready = 0;             // of `reduced`, arrived in this backward
    bool launched = false;        // its reduction started in this backward
    std::shared_ptr<TensorWork> reduction;
  };

  ShardedState(std::shared_ptr<ProcessGroup> group, ShardingStrategy strategy, bool prefetch);
  ~ShardedState();

  // Construction: takes the module's parameters (rank 0's values) and units.
  void shard(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& units);

  // An operator is about to use parameter i (Note [Sharded parameters]): gathers its unit or throws.
  void touch(size_t i, const std::string& op);

  void begin_forward();
  void end_forward(bool ok);

  // Backward (backward.cc).
  void on_grad_ready(size_t i);
  void finalize_backward();
  bool set_sync(bool sync);

  // GatheredParameters (gathered.cc): indices must be free of holders (checked first).
  std::string hold_problem(const std::vector<size_t>& indices);
  void hold(const std::vector<size_t>& indices);
  // Re-shards; with a modifier its values first become everyone's. Returns "" or the names of
  // parameters edited in place without a modifier (on which ranks).
  std::string release(const std::vector<size_t>& indices, std::optional<int> modifier_rank);
  // Gives the parameters back on this rank alone (an entry that failed half way).
  void drop(const std::vector<size_t>& indices);

  std::vector<at::Tensor> shards();
  torch::OrderedDict<std::string, at::Tensor> named_shards();
  torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& module);
  ShardedDataParallel::MemoryStats memory_stats() const;
  void reset_peak_memory();
  std::vector<std::pair<std::string, std::vector<std::string>>> unit_layout() const;

  const Param& param(size_t i) const { return params_[i]; }
  size_t size() const { return params_.size(); }
  ShardingStrategy strategy() const { return strategy_; }
  int world() const { return world_; }
  // Checkpoints: before shards are overwritten, no full copy may be alive (InvalidArgument during
  // forward, backward or a GatheredParameters); the kept ones (ShardGradOp) are dropped.
  void prepare_load();
  // Made-order of the ShardedDataParallels of this process (the same on every rank that makes
  // them in the same order): GatheredParameters' canonical order.
  uint64_t id() const { return id_; }
  ProcessGroup& group() { return *group_; }
  bool busy() const;  // in forward or a backward
  // An error a GatheredParameters destructor could not throw: thrown by the next forward or
  // GatheredParameters.
  void defer_error(std::exception_ptr e);
  void rethrow_deferred();

 private:
  // Callers hold mu_.
  void gather_unit(size_t u);
  void prefetch_unit(size_t u);
  void free_unit(size_t u);
  void gather_param(size_t i);
  void free_param(size_t i);
  void account();
  void queue_finalize();
  void launch_ready_reductions();
  void launch_reduction(size_t u);
  void reset_backward();
  // Buffers for full parameters and reductions, reused across steps (a fresh allocation of this
  // size is a fresh mapping: page faults on every step).
  at::Tensor take_buffer(int64_t numel, const at::TensorOptions& options);
  void give_back(at::Tensor t);

  std::shared_ptr<ProcessGroup> group_;
  const uint64_t id_;
  const ShardingStrategy strategy_;
  const bool prefetch_;
  int world_ = 1, rank_ = 0;
  std::vector<Param> params_;
  std::vector<Unit> units_;  // units_[0]: the root unit
  std::vector<at::Tensor> buffers_;
  GradReadyHooks hooks_;  // on_grad_ready after each gradient (backward.cc)

  mutable std::mutex mu_;
  bool in_forward_ = false, forward_grad_ = false;
  std::vector<size_t> forward_order_, last_order_;  // units in the order forward first used them
  std::vector<char> seen_in_forward_;
  std::optional<size_t> current_;  // the unit forward used last
  // Backward: reductions start in this order (the reverse of the forward's, then units it did not
  // use), each once every unit before it started.
  std::vector<size_t> reduction_order_;
  size_t next_reduction_ = 0;
  bool finalize_queued_ = false, sync_ = true;
  std::exception_ptr deferred_;

  int64_t full_bytes_ = 0, full_grad_bytes_ = 0, peak_transient_ = 0;
  std::vector<at::Tensor> spare_;
  int64_t spare_bytes_ = 0, spare_limit_ = 0;
};

}  // namespace chorus::detail
