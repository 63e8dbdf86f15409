// Sharded data parallel (ZeRO-2/3, FSDP-style) and GatheredParameters (docs/api.md, "Sharded data
// parallel").
//
// Parameters, gradients and optimizer state are split across the group's ranks, so a model whose
// replicated training state does not fit still trains. A parameter of N elements is cut in shards
// of S = ceil(N/W) elements: rank r owns elements [r*S, min(N, (r+1)*S)) of its flattened values,
// zero-padded to S. The optimizer works on the shards (parameters()).
//
// C++ modules have no forward hooks, so chorus does not wrap the module's forward: the module's
// own parameter tensors become sharded parameters (same sizes, dtype and autograd identity, no
// values). Every operator that reaches one comes to chorus first (Note [Sharded parameters] in
// torch/src/parallel/sharded/param_kernel.cc): inside forward(fn) and during backward it gathers the
// parameter's unit and lets the operator run on the full values; anywhere else it throws
// InvalidArgument naming the parameter, so the module can never compute with a shard by mistake.
#pragma once

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/ddp.h"
#include "chorus/process_group.h"

namespace chorus {

namespace detail {
class DataParallelEngine;  // what runs a ShardedDataParallel's strategy (torch/src/parallel/sharded/engine.h)
struct GatheredEntry;      // one module's (or DDP group's) share of a GatheredParameters (sharded/gathered.cc)
}  // namespace detail

enum class ShardingStrategy {
  FullShard,    // ZeRO-3: full parameters exist only while a unit computes (forward, then again in backward)
  ShardGradOp,  // ZeRO-2: full parameters kept from forward to the end of backward
  NoShard,      // the DDP path: replicas, gradients all-reduced
};

struct ShardedOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  std::shared_ptr<ProcessGroup> group = nullptr;  // default: the default group
  // Units: submodules whose parameters are gathered and freed together, one unit at a time. A
  // parameter belongs to the innermost listed unit that holds it; the others form the root unit
  // (with no units listed, the whole module is one unit). One line per unit, e.g.
  //   options.units = {model->fc1.ptr(), model->fc2.ptr()};   or   chorus::units_of_size(model, 1e6)
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  // Gathers the next unit (the order of the previous forward; backward: its reverse) while the
  // current one computes.
  bool prefetch = true;
};

// Every descendant of `module` (innermost first) that directly or through its children holds at
// least `min_params` parameter elements not already in a chosen unit below it: FSDP's size-based
// policy, for ShardedOptions::units.
std::vector<std::shared_ptr<torch::nn::Module>> units_of_size(const std::shared_ptr<torch::nn::Module>& module,
                                                              int64_t min_params);

class ShardedDataParallel {
 public:
  // Collective over the group: rank 0's parameters and buffers win, then each rank keeps only its
  // shards and the full parameter memory is released. Throws InvalidArgument for a null module,
  // parameters off the CPU, or a unit that is not part of the module.
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, ShardedOptions options = {});
  template <class Holder, class = std::enable_if_t<!std::is_convertible_v<Holder, std::shared_ptr<torch::nn::Module>>>>
  explicit ShardedDataParallel(Holder& module, ShardedOptions options = {})  // torch::nn::Linear, TORCH_MODULE(...)
      : ShardedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(options)) {}
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  // Runs fn (which calls the module's forward) with the parameters it touches gathered, unit by
  // unit, and arranges backward: units re-gathered as the strategy says, each unit's gradients
  // reduce-scattered into the shards as soon as they are ready. Returns what fn returns.
  template <class F>
  auto forward(F&& fn) -> decltype(fn());

  // This rank's shards, one per parameter, in module()->parameters() order (a tied parameter,
  // registered twice, once): give these to the optimizer. After backward, .grad is the shard's
  // gradient averaged over the group.
  std::vector<at::Tensor> parameters();
  // The same with the parameters' names.
  torch::OrderedDict<std::string, at::Tensor> named_parameters();

  // While alive, backward passes accumulate full gradients locally; the next backward outside it
  // reduces the accumulated gradients.
  NoSyncGuard no_sync();

  // Collective: the unsharded parameters and the buffers, gathered one parameter at a time onto
  // rank 0 (named as module()->named_parameters() and named_buffers() name them); empty on the
  // other ranks.
  torch::OrderedDict<std::string, at::Tensor> full_state_dict();

  torch::nn::Module& module() { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() { return module_; }
  // The group it works over (after an elastic recovery, the new one: Note [Elastic in process]).
  ProcessGroup& group();
  ShardingStrategy strategy() const { return options_.strategy; }

  // What this rank holds for training, in bytes: shards, their gradients, full parameters and
  // gradients alive now (and their peak since the last reset), for memory accounting.
  struct MemoryStats {
    int64_t shard_bytes = 0, shard_grad_bytes = 0;
    int64_t full_bytes = 0, full_grad_bytes = 0;  // now
    int64_t peak_transient_bytes = 0;             // peak of full_bytes + full_grad_bytes + reduction buffers
    int64_t cached_bytes = 0;  // freed full-size buffers kept for the next step (at most 2 of the largest unit)
  };
  MemoryStats memory_stats() const;
  void reset_peak_memory();

  // The units, as their names in the module ("" for the root unit), and the parameter names each
  // holds.
  std::vector<std::pair<std::string, std::vector<std::string>>> unit_layout() const;

 private:
  friend class NoSyncGuard;
  struct ForwardScope {  // marks the forward; ends it however fn leaves
    explicit ForwardScope(ShardedDataParallel& s);
    ~ForwardScope();
    void finished();
    ShardedDataParallel& self;
    bool ok = false;
  };
  std::shared_ptr<torch::nn::Module> module_;
  ShardedOptions options_;
  std::shared_ptr<detail::DataParallelEngine> engine_;
};

template <class F>
auto ShardedDataParallel::forward(F&& fn) -> decltype(fn()) {
  ForwardScope scope(*this);
  if constexpr (std::is_void_v<decltype(fn())>) {
    fn();
    scope.finished();
  } else {
    auto out = fn();
    scope.finished();
    return out;
  }
}

// Full parameters while alive (Accelerate / DeepSpeed's GatheredParameters). Collective over each
// sharded module's group, on entry and on exit.
//   - Takes tensors or modules (several: the seed's *models); duplicates are removed and a
//     canonical order is used, so every rank issues the same collectives.
//   - Inside: full shapes and values. On exit with modifier_rank r, r's values become everyone's
//     and are re-sharded; without one, an in-place edit made inside is an error on every rank
//     naming the parameter (the shards stay as they were).
//   - Parameters that are not sharded (a plain module, DDP, one process) make it a no-op, except
//     that under DDP a modifier_rank's values are broadcast on exit so the replicas stay equal.
//     enabled = false is a no-op without communication.
//   - Nesting over disjoint parameters works; overlapping nesting is InvalidArgument before any
//     collective, as is entering during a sharded module's forward or backward. Ranks that enter
//     with different parameter lists raise CollectiveMismatch showing each rank's list; a rank
//     that never enters makes the others raise TimeoutError naming it at the group's deadline.
class GatheredParameters {
 public:
  explicit GatheredParameters(std::vector<at::Tensor> params, std::optional<int> modifier_rank = std::nullopt,
                              bool enabled = true);
  explicit GatheredParameters(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::optional<int> modifier_rank = std::nullopt, bool enabled = true);
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;
  // Re-shards now; throws what went wrong (an edit without a modifier, a missing rank). Once.
  void exit();
  // exit() if not done. Never throws: an error it meets is printed and thrown again by the next
  // forward or GatheredParameters on that module.
  ~GatheredParameters();

 private:
  void enter(std::vector<at::Tensor> params, std::optional<int> modifier_rank);
  std::vector<std::shared_ptr<detail::GatheredEntry>> entries_;
  bool done_ = true;
};

}  // namespace chorus
