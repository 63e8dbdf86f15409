// Lightning Fabric's distributed operations.
//
//   chorus::Fabric fabric({.devices = 4});
//   fabric.launch();                       // 4 processes here, or whatever a launcher started
//   auto mean_loss = fabric.all_reduce(loss);
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "chorus/checkpoint.h"
#include "chorus/ddp.h"
#include "chorus/process_group.h"
#include "chorus/sharded.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

struct FabricOptions {
  std::string accelerator = "cpu";  // "cpu" (or "auto"): this build drives CPUs only
  int devices = 1;                  // processes on this machine when no launcher started us
  int num_nodes = 1;
  std::string strategy = "ddp";  // "ddp" (or "auto"), or "fsdp": sharded data parallel (setup_module)
  std::string backend = "auto";
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

class Fabric {
 public:
  // Not collective. Throws InvalidArgument for an accelerator, strategy or device count this
  // build cannot serve.
  explicit Fabric(FabricOptions options = {});

  // Collective over the job. When no launcher started this program and devices > 1, starts
  // devices - 1 more copies of it (same arguments) as local ranks 1..devices-1 and becomes rank
  // 0; then joins the default group. Every rank returns. Children die with the parent, and the
  // parent's exit waits for them and reports any that failed.
  void launch();

  int global_rank() const;
  int local_rank() const;
  int node_rank() const;
  int world_size() const;
  bool is_global_zero() const { return global_rank() == 0; }
  const FabricOptions& options() const { return options_; }

  // Collective. The name appears in errors (a timeout names the barrier).
  void barrier(const std::string& name = "");
  // Collective: src's tensor on every rank (shapes and dtypes may differ before the call).
  at::Tensor broadcast(const at::Tensor& t, int src = 0);
  // Collective: src's object (any IValue: tensors, dicts, lists, tuples, strings, numbers).
  c10::IValue broadcast(const c10::IValue& obj, int src = 0);
  // Collective over group (default: the world): stacked (W, ...). With sync_grads the result
  // is differentiable (see all_gather_with_grad).
  at::Tensor all_gather(const at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr, bool sync_grads = false);
  // Every tensor and number leaf of a collection stacked (W, ...); containers kept.
  c10::IValue all_gather(const c10::IValue& data, std::shared_ptr<ProcessGroup> group = nullptr,
                         bool sync_grads = false);
  // Collective: a new tensor, the reduction over the group (Mean: floating types only).
  at::Tensor all_reduce(const at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr,
                        ReduceOp op = ReduceOp::Mean);
  at::Tensor all_reduce(const at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op);
  // Every tensor and number leaf reduced (numbers come back as numbers); containers kept.
  c10::IValue all_reduce(const c10::IValue& data, std::shared_ptr<ProcessGroup> group = nullptr,
                         ReduceOp op = ReduceOp::Mean);
  c10::IValue all_reduce(const c10::IValue& data, std::shared_ptr<ProcessGroup> group, std::string_view op);

  at::Device device() const { return at::Device(at::kCPU); }
  at::Tensor to_device(const at::Tensor& t) const;
  c10::IValue to_device(const c10::IValue& data) const;

  // Not collective: prints args separated by spaces and a newline, on global rank 0 only.
  template <class... Args>
  void print(Args&&... args) const {
    if (global_rank() != 0) return;
    bool first = true;
    ((std::cout << (first ? "" : " ") << args, first = false), ...);
    std::cout << std::endl;
  }

  // Collective: rank 0 (of the node, when local) runs fn first, then the others. If it fails,
  // every rank raises an Error carrying its message.
  void rank_zero_first(const std::function<void()>& fn, bool local = false);

  // Collective (after launch): wraps the module for gradient sync over the world and keeps the
  // wrapper; returns it. The optimizer needs nothing: it holds the module's own parameters.
  DistributedDataParallel& setup(std::shared_ptr<torch::nn::Module> module, DDPOptions options = {});
  DistributedDataParallel& setup(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                                 DDPOptions options = {});
  template <class Holder>  // torch::nn::Linear, torch::nn::Sequential, your TORCH_MODULE(...)
  requires requires(Holder h) { h.ptr(); }
  DistributedDataParallel& setup(Holder& module, DDPOptions options = {}) {
    return setup(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(options));
  }
  // Collective (after launch): Lightning's setup_module. Under strategy "fsdp", shards the module
  // (ShardedDataParallel with `options`, FullShard unless they say otherwise); under "ddp", keeps
  // replicas (the same class, NoShard), so one training loop serves both. Build the optimizer
  // after it, over the returned object's parameters(); call the module through its forward().
  ShardedDataParallel& setup_module(std::shared_ptr<torch::nn::Module> module, ShardedOptions options = {});
  template <class Holder>
  requires requires(Holder h) { h.ptr(); }
  ShardedDataParallel& setup_module(Holder& module, ShardedOptions options = {}) {
    return setup_module(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(options));
  }
  // While the guard lives, backward passes of this set-up module accumulate gradients locally;
  // a no-op guard when not enabled. InvalidArgument for a module this Fabric did not set up.
  NoSyncGuard no_backward_sync(DistributedDataParallel& module, bool enabled = true);
  NoSyncGuard no_backward_sync(ShardedDataParallel& module, bool enabled = true);
  NoSyncGuard no_backward_sync(const torch::nn::Module& module, bool enabled = true);

  // Collective: Lightning's save/load (save_checkpoint / load_checkpoint over the world).
  //   fabric.save("ckpt", {{"model", sdp}, {"optimizer", opt}, {"step", step}});
  // Auto: a sharded checkpoint (a directory) when a module is sharded, else one file. load
  // restores the state's items in place and returns the checkpoint's other items.
  void save(const std::string& path, const CheckpointState& state, CheckpointFormat format = CheckpointFormat::Auto);
  c10::impl::GenericDict load(const std::string& path, const CheckpointState& state = {}, bool strict = true);

 private:
  ProcessGroup& world() const;
  ProcessGroup& node_group();

  FabricOptions options_;
  Environment env_;
  std::shared_ptr<ProcessGroup> node_;
  std::vector<std::unique_ptr<DistributedDataParallel>> wrapped_;
  std::vector<std::unique_ptr<ShardedDataParallel>> sharded_;
  bool set_up(const std::shared_ptr<torch::nn::Module>& module) const;
};

}  // namespace chorus
