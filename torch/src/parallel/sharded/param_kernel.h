// Sharded parameters: the module's own tensors, turned into handles whose operators come to chorus
// (Note [Sharded parameters] in param_kernel.cc).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>

namespace chorus::detail {

class ShardOwner;

// Makes p a sharded parameter: same TensorImpl (so the module's members, autograd's graph and the
// optimizer's references keep pointing at it), same sizes, dtype and version counter, but a
// storage chorus owns (returned: empty now, filled by gather) and the dispatch key that sends its
// operators to on_sharded_op. Registers it as parameter `index` of `owner` (placement.h; the
// owner forgets it with forget_shard).
c10::intrusive_ptr<c10::StorageImpl> make_sharded(at::Tensor& p, const std::shared_ptr<ShardOwner>& owner,
                                                  size_t index);
// Points the sharded storage at `values` (nbytes of them), or at nothing (null).
void fill_storage(c10::StorageImpl& storage, void* values, size_t nbytes);

}  // namespace chorus::detail
