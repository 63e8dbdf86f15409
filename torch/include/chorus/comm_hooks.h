// Communication hooks of DistributedDataParallel (docs/api.md, "DDP and comm hooks"): what a
// hook sees (GradBucket), the hook type, and the built-in hooks (factories; each hook owns its
// state): all-reduce, fp16/bf16 compression and wrappers, PowerSGD, post-local SGD, and the
// periodic model averager that goes with it. Register one with
// DistributedDataParallel::register_comm_hook (chorus/ddp.h) or Lightning's register_ddp_comm_hook.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "chorus/process_group.h"

namespace chorus {

// What a comm hook sees: one bucket of gradients.
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
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

// ---- built-in hooks ------------------------------------------------------------------------------
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

}  // namespace chorus
