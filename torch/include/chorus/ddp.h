// Keeping model replicas in sync: DistributedDataParallel (docs/api.md, "DDP and comm hooks";
// the hooks are in chorus/comm_hooks.h).
//
// A C++ torch::nn::Module has no generic forward, so chorus does not wrap the call: it attaches
// to the module's parameters. Keep calling your module; during loss.backward() each parameter's
// gradient lands in a bucket (reverse registration order, bucket_cap_mb each, the first one
// first_bucket_mb), each bucket's all-reduce (or comm hook) starts on the communication thread
// as soon as its last gradient is in, and backward returns once every bucket is reduced and
// copied back into the .grad tensors, averaged over the group.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

#include "chorus/comm_hooks.h"
#include "chorus/process_group.h"

namespace chorus {

struct DDPOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool broadcast_buffers = true;                  // buffers (batch-norm statistics...) follow rank 0's: at
                                                  // construction and after every synchronized backward
  bool find_unused_parameters = false;            // true: parameters without a gradient count as zero;
                                                  // false: such a parameter is an error naming it
  std::shared_ptr<ProcessGroup> group = nullptr;  // default: the default group
};

class DistributedDataParallel;
class ShardedDataParallel;

// While alive, backward passes accumulate gradients locally (no communication); the next
// backward outside it synchronizes the accumulated gradients.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallel* ddp);  // null: a guard that does nothing
  explicit NoSyncGuard(ShardedDataParallel* sdp);      // (chorus/sharded.h)
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  std::function<void()> restore_;  // puts synchronization back as it was
};
// Lightning's name for the same guard; Fabric::no_backward_sync returns a NoSyncGuard.
using NoBackwardSync [[deprecated("use chorus::NoSyncGuard")]] = NoSyncGuard;

class DistributedDataParallel {
 public:
  // Collective over the group: broadcasts parameters and buffers from rank 0, builds the buckets
  // and attaches the gradient hooks. Throws InvalidArgument when the module has no parameter
  // that requires a gradient, or parameters off the CPU.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() { return module_; }
  ProcessGroup& group() { return *group_; }

  NoSyncGuard no_sync() { return NoSyncGuard(this); }
  // Replaces the default all-reduce; once, before the first backward (else InvalidArgument).
  void register_comm_hook(CommHook hook);
  // Collective: copies rank 0's buffers to every rank.
  void sync_buffers();

  // How the parameters were bucketed: bucket i holds these parameter indices (in
  // module()->parameters() order).
  std::vector<std::vector<size_t>> bucket_layout() const;

 private:
  friend class NoSyncGuard;
  struct Reducer;  // the gradient machinery (ddp.cc)
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace chorus
