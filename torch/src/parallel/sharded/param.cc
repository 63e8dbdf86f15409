// ShardedParam: one parameter's gather, reduction and hold (Note [Sharded units] in state.cc,
// Note [Sharded backward] in backward.cc).
#include "parallel/sharded/param.h"

#include "parallel/sharded/param_kernel.h"

namespace chorus::detail {

void BufferCache::set_arena(at::Tensor memory) { arena_ = std::make_shared<SymmetricArena>(std::move(memory)); }

at::Tensor BufferCache::take(int64_t numel, const at::TensorOptions& options) {
  for (size_t k = 0; k < spare_.size(); ++k) {
    if (spare_[k].numel() != numel || spare_[k].scalar_type() != options.dtype().toScalarType()) continue;
    at::Tensor t = std::move(spare_[k]);
    spare_.erase(spare_.begin() + long(k));
    bytes_ -= bytes_of(t);
    return t;
  }
  if (arena_ && numel > 0)
    if (at::Tensor t = arena_->take(numel, options); t.defined()) return t;
  return at::empty({numel}, options.requires_grad(false));
}

void BufferCache::give_back(at::Tensor t) {
  if (!t.defined()) return;
  const int64_t b = bytes_of(t);
  while (!spare_.empty() && bytes_ + b > limit_) {  // the oldest go first
    bytes_ -= bytes_of(spare_.front());
    spare_.erase(spare_.begin());
  }
  if (b > limit_) return;
  bytes_ += b;
  spare_.push_back(std::move(t));
}

ShardedParam::ShardedParam(std::string name_, at::Tensor param_, const at::Tensor& values, size_t unit_,
                           const ShardingContext& c)
    : name(std::move(name_)),
      param(std::move(param_)),
      numel(values.numel()),
      shard_numel(detail::shard_numel(numel, c.world)),
      mine(shard_range(numel, shard_numel, c.rank)),
      unit(unit_) {
  shard = at::zeros({shard_numel}, values.options().requires_grad(false));
  if (mine.size() > 0) shard.narrow(0, 0, mine.size()).copy_(values.reshape({-1}).narrow(0, mine.begin, mine.size()));
  shard.set_requires_grad(param.requires_grad());  // (values may be a contiguous copy, made without grad)
}

ShardedParam::ShardedParam(std::string name_, at::Tensor param_, int64_t numel_, at::Tensor shard_, size_t unit_,
                           const ShardingContext& c)
    : name(std::move(name_)),
      param(std::move(param_)),
      numel(numel_),
      shard_numel(detail::shard_numel(numel, c.world)),
      mine(shard_range(numel, shard_numel, c.rank)),
      shard(std::move(shard_)),
      unit(unit_) {
  at::NoGradGuard no_grad;
  shard.mutable_grad().reset();
  shard.set_data(at::zeros({shard_numel}, shard.options().requires_grad(false)));
}

void ShardedParam::gather(ShardingContext& c) {
  if (full_.defined()) return;
  if (gathering_) {
    auto work = std::move(gathering_);
    gathering_.reset();
    full_ = std::move(incoming_);
    incoming_.reset();
    work->wait();
  } else {
    full_ = c.buffers.take(c.world * shard_numel, shard.options());
    c.group->all_gather_into(full_, shard.detach());
  }
  fill_storage(*storage, full_.data_ptr(), size_t(numel) * full_.element_size());
  c.memory.add(bytes_of(full_), 0);
}

void ShardedParam::prefetch(ShardingContext& c) {
  if (full_.defined() || gathering_) return;
  incoming_ = c.buffers.take(c.world * shard_numel, shard.options());
  gathering_ = c.group->all_gather_into_async(incoming_, shard.detach());
}

void ShardedParam::free(ShardingContext& c) {
  if (held) return;
  if (gathering_) {  // a prefetch nobody used: let it land, then drop it
    try {
      gathering_->wait();
    } catch (...) {  // a failed group fails its next collective again; this runs in destructors
    }
    gathering_.reset();
    c.buffers.give_back(std::move(incoming_));
    incoming_.reset();
  }
  if (!full_.defined()) return;
  fill_storage(*storage, nullptr, 0);
  c.memory.add(-bytes_of(full_), 0);
  c.buffers.give_back(std::move(full_));
  full_.reset();
}

void ShardedParam::note_grad(ShardingContext& c) {
  const int64_t now = bytes_of(param.grad());
  c.memory.add(0, now - counted_grad_);
  counted_grad_ = now;
}

void ShardedParam::drop_grad(ShardingContext& c) {
  param.mutable_grad().reset();
  note_grad(c);
}

int64_t ShardedParam::start_reduction(ShardingContext& c) {
  const int64_t padded = c.world * shard_numel;
  at::Tensor grad = param.grad();
  at::Tensor in;
  if (grad.defined() && grad.numel() == padded && grad.is_contiguous()) {
    in = grad.reshape({-1});  // already W blocks of S: no copy (the work keeps it alive)
  } else {
    in = reduce_in_ = c.buffers.take(padded, shard.options());
    if (grad.defined()) {
      in.narrow(0, 0, numel).copy_(grad.reshape({-1}));
      in.narrow(0, numel, padded - numel).zero_();
    } else {
      in.zero_();  // no gradient in this backward: it counts as zero
    }
  }
  drop_grad(c);
  reduce_out_ = c.buffers.take(shard_numel, shard.options());
  reduction_ = c.group->reduce_scatter_into_async(reduce_out_, in, ReduceOp::Sum);
  return (padded + shard_numel) * int64_t(shard.element_size());
}

void ShardedParam::finish_reduction(ShardingContext& c) {
  if (!reduction_) return;
  auto work = std::move(reduction_);
  reduction_.reset();
  at::Tensor block = std::move(reduce_out_);
  reduce_out_.reset();
  c.buffers.give_back(std::move(reduce_in_));  // a padded copy (a gradient used as it was is not ours)
  reduce_in_.reset();
  try {
    work->wait();
  } catch (...) {
    c.buffers.give_back(std::move(block));
    throw;
  }
  block.div_(c.world);  // the one division that makes the sum a mean
  at::Tensor& grad = shard.mutable_grad();
  if (grad.defined()) {
    grad.add_(block);
    c.buffers.give_back(std::move(block));
  } else {
    grad = block;
  }
}

void ShardedParam::abandon_reduction(ShardingContext& c) {
  if (reduction_) try {
      reduction_->wait();
    } catch (...) {  // that backward already raised its error
    }
  reduction_.reset();
  c.buffers.give_back(std::move(reduce_in_));
  reduce_in_.reset();
  reduce_out_.reset();
}

int64_t ShardedParam::version() const {
  return int64_t(param.unsafeGetTensorImpl()->version_counter().current_version());
}

}  // namespace chorus::detail
