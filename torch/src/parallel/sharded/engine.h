// What ShardedDataParallel asks of its engine, whatever the strategy: ShardedState for FullShard
// and ShardGradOp, replicas kept by a DistributedDataParallel for NoShard (sharded.cc). One
// interface, so the public class forwards each call once instead of asking which engine it has.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "chorus/sharded.h"

namespace chorus::detail {

class DataParallelEngine {
 public:
  virtual ~DataParallelEngine() = default;
  virtual void begin_forward() = 0;
  virtual void end_forward(bool ok) = 0;
  // What the optimizer takes: this rank's shards (or the replicated parameters).
  virtual std::vector<at::Tensor> parameters() = 0;
  virtual torch::OrderedDict<std::string, at::Tensor> named_parameters() = 0;
  // Gradient synchronization on or off (no_sync); returns what it was.
  virtual bool set_sync(bool sync) = 0;
  virtual torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& module) = 0;
  virtual ShardedDataParallel::MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  virtual std::vector<std::pair<std::string, std::vector<std::string>>> unit_layout() const = 0;
  virtual const std::shared_ptr<ProcessGroup>& group_ptr() const = 0;  // the group it works over now
};

}  // namespace chorus::detail
