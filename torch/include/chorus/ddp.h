// Keeping model replicas in sync: DistributedDataParallel and its communication hooks.
//
// A C++ torch::nn::Module has no generic forward, so chorus does not wrap the call: it attaches
// to the module's parameters. Keep calling your module; during loss.backward() each parameter's
// gradient lands in a bucket (reverse registration order, bucket_cap_mb each, the first one
// first_bucket_mb), each bucket's all-reduce (or comm hook) starts on the communication thread
// as soon as its last gradient is in, and backward returns once every bucket is reduced and
// copied back into the .grad tensors, averaged over the group.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/process_group.h"

namespace chorus {

struct DDPOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool broadcast_buffers = true;        // buffers (batch-norm statistics...) follow rank 0's: at
                                        // construction and after every synchronized backward
  bool find_unused_parameters = false;  // true: parameters without a gradient count as zero;
                                        // false: such a parameter is an error naming it
  std::shared_ptr<ProcessGroup> group = nullptr;  // default: the default group
};

// What a comm hook sees: one bucket of gradients.
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters)
      : index_(index), is_last_(is_last), buffer_(std::move(buffer)), gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}
  size_t index() const { return index_; }
  bool is_last() const { return is_last_; }
  at::Tensor& buffer() { return buffer_; }                                 // flat, contiguous
  const std::vector<at::Tensor>& gradients() const { return gradients_; }  // views into buffer()
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  // Element offset of gradient i in buffer(), and its shape.
  int64_t offset(size_t i) const { return gradients_[i].storage_offset() - buffer_.storage_offset(); }

 private:
  size_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_, parameters_;
};

// A hook reduces a bucket: it returns a future whose value is the reduced (averaged) flat
// tensor, shaped like bucket.buffer().
using CommHook = std::function<c10::intrusive_ptr<c10::ivalue::Future>(GradBucket&)>;

class DistributedDataParallel;

// While alive, backward passes accumulate gradients locally (no communication); the next
// backward outside it synchronizes the accumulated gradients.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallel* ddp);  // null: a guard that does nothing
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  DistributedDataParallel* ddp_;
  bool previous_ = false;
};
using NoBackwardSync = NoSyncGuard;

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

  struct Reducer;  // the gradient machinery (ddp.cc)

 private:
  friend class NoSyncGuard;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
};

// ---- built-in hooks (factories; each hook owns its state) -----------------------------------
CommHook allreduce_hook(std::shared_ptr<ProcessGroup> group = nullptr);
CommHook fp16_compress_hook(std::shared_ptr<ProcessGroup> group = nullptr);
CommHook bf16_compress_hook(std::shared_ptr<ProcessGroup> group = nullptr);
// inner runs on a half-precision copy of the bucket; its result comes back as f32.
CommHook fp16_compress_wrapper(CommHook inner);
CommHook bf16_compress_wrapper(CommHook inner);

struct PowerSGDState {
  std::shared_ptr<ProcessGroup> group;
  int matrix_approximation_rank = 1;
  int start_powerSGD_iter = 1000;  // plain all-reduce before this iteration (lets training settle)
  bool use_error_feedback = true;
  bool warm_start = true;
  // A gradient matrix is compressed only when that shrinks it at least this many times (n*m
  // against (n+m)*rank); the others are averaged as they are. 0: compress every matrix.
  double min_compression_rate = 2;
  uint64_t seed = 0;
  // Kept between iterations, per bucket: the error feedback and the P and Q factors.
  int64_t iter = 0;
  std::map<size_t, at::Tensor> error, p, q;
};
CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state);
CommHook batched_powerSGD_hook(std::shared_ptr<PowerSGDState> state);

struct PostLocalSGDState {
  std::shared_ptr<ProcessGroup> subgroup;  // e.g. the ranks of one node
  int start_localSGD_iter = 0;             // global all-reduce before this iteration, subgroup after
  std::shared_ptr<ProcessGroup> group;     // the global group (default: the default group)
  int64_t iter = 0;
};
CommHook post_localSGD_hook(std::shared_ptr<PostLocalSGDState> state);

// After warmup_steps, averages the parameters over the group every `period` steps (call it once
// per optimizer step; collective when it averages).
class PeriodicModelAverager {
 public:
  PeriodicModelAverager(int period, int warmup_steps = 0, std::shared_ptr<ProcessGroup> group = nullptr);
  void average_parameters(const std::vector<at::Tensor>& params);
  int64_t step() const { return step_; }

 private:
  int period_, warmup_;
  std::shared_ptr<ProcessGroup> group_;
  int64_t step_ = 0;
};

// Lightning's form: the hook takes its state explicitly; the wrapper is optional.
template <class State>
void register_ddp_comm_hook(DistributedDataParallel& model, std::shared_ptr<State> state,
                            std::function<c10::intrusive_ptr<c10::ivalue::Future>(State&, GradBucket&)> hook,
                            std::function<CommHook(CommHook)> wrapper = nullptr) {
  CommHook bound = [state, hook = std::move(hook)](GradBucket& b) { return hook(*state, b); };
  model.register_comm_hook(wrapper ? wrapper(std::move(bound)) : std::move(bound));
}

}  // namespace chorus
