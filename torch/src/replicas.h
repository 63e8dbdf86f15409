// Which DDP group keeps a parameter replicated, for GatheredParameters (Note [Gathered
// parameters] in sharded/gathered.cc).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "chorus/process_group.h"

namespace chorus::detail {

// The group of the live DistributedDataParallel that holds `t` as a parameter; null if none.
std::shared_ptr<ProcessGroup> replica_group(const at::Tensor& t);
// A DistributedDataParallel's parameters, while it lives.
void register_replicas(const std::vector<at::Tensor>& params, const std::shared_ptr<ProcessGroup>& group);
void unregister_replicas(const std::vector<at::Tensor>& params);

}  // namespace chorus::detail
