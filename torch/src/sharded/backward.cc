// Note [Sharded backward]
// Autograd accumulates each parameter's full gradient into the module tensor's .grad, as for any
// leaf; a post-hook on its AccumulateGrad tells the state it arrived. When every parameter of a
// unit that wants a gradient has one, the unit's reduction starts: per parameter, a reduce-scatter
// (sum) of its gradient seen as W blocks of S elements (the gradient itself when N = W * S, else a
// zero-padded copy) into a block of S, queued on the group's executor, where it runs while
// autograd goes on with the units before. The .grad tensors are dropped and FullShard frees the
// unit's parameters. Reductions start strictly in reduction order (the reverse of forward's,
// then the units forward did not use), whatever order a rank's gradients come in, so every rank
// queues the same collectives.
//
// When backward ends (an autograd final callback, queued by the first hook or gather of the
// pass), units still waiting reduce what they have (a parameter without a gradient counts as
// zero), every reduction is waited for, and its block, divided once by the world size, is added
// to the shard's .grad (set when it had none): gradients accumulate across backwards until the
// optimizer zeroes them, as for any parameter.
//
// no_sync: nothing is reduced; full gradients stay in .grad and keep accumulating, and the next
// synchronized backward reduces their sum.
#include <torch/csrc/autograd/engine.h>

#include "grad_hooks.h"
#include "sharded/state.h"

namespace chorus::detail {

void ShardedState::queue_finalize() {
  if (finalize_queued_) return;
  finalize_queued_ = true;
  at_backward_end(weak_from_this(), &ShardedState::finalize_backward);
}

bool ShardedState::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(sync_, sync);
}

void ShardedState::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_finalize();
  Param& p = params_[i];
  if (p.ready) return;
  p.ready = true;
  ++units_[p.unit].ready;
  account();
  launch_ready_reductions();
}

void ShardedState::launch_ready_reductions() {
  while (next_reduction_ < reduction_order_.size()) {
    const size_t u = reduction_order_[next_reduction_];
    if (units_[u].ready < units_[u].reduced.size()) return;
    launch_reduction(u);
    ++next_reduction_;
  }
}

void ShardedState::launch_reduction(size_t u) {
  Unit& unit = units_[u];
  if (unit.launched) return;
  unit.launched = true;
  if (sync_) {
    at::NoGradGuard no_grad;
    int64_t in_flight = 0;
    for (size_t i : unit.reduced) {
      Param& p = params_[i];
      const int64_t padded = world_ * p.shard_numel;
      at::Tensor grad = p.param.grad();
      at::Tensor in;
      if (grad.defined() && grad.numel() == padded && grad.is_contiguous()) {
        in = grad.reshape({-1});  // already W blocks of S: no copy (the work keeps it alive)
      } else {
        in = p.reduce_in = take_buffer(padded, p.shard.options());
        if (grad.defined()) {
          in.narrow(0, 0, p.numel).copy_(grad.reshape({-1}));
          in.narrow(0, p.numel, padded - p.numel).zero_();
        } else {
          in.zero_();  // no gradient in this backward: it counts as zero
        }
      }
      p.param.mutable_grad().reset();
      p.reduce_out = take_buffer(p.shard_numel, p.shard.options());
      p.reduction = group_->reduce_scatter_into_async(p.reduce_out, in, ReduceOp::Sum);
      in_flight += (padded + p.shard_numel) * int64_t(p.shard.element_size());
    }
    peak_transient_ = std::max(peak_transient_, full_bytes_ + full_grad_bytes_ + in_flight);
  }
  if (strategy_ == ShardingStrategy::FullShard) free_unit(u);
  account();
}

void ShardedState::finalize_backward() {
  std::unique_lock<std::mutex> lock(mu_);
  std::exception_ptr error;
  try {
    for (size_t k = next_reduction_; k < reduction_order_.size(); ++k) launch_reduction(reduction_order_[k]);
    next_reduction_ = reduction_order_.size();
  } catch (...) {
    error = std::current_exception();
  }
  at::NoGradGuard no_grad;
  for (size_t u : reduction_order_) {
    for (size_t i : units_[u].reduced) {
      Param& p = params_[i];
      if (!p.reduction) continue;
      auto work = std::move(p.reduction);
      p.reduction.reset();
      try {
        work->wait();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      at::Tensor block = std::move(p.reduce_out);
      p.reduce_out.reset();
      give_back(std::move(p.reduce_in));  // a padded copy (a gradient used as it was is not ours)
      p.reduce_in.reset();
      if (error) continue;
      block.div_(world_);  // the one division that makes the sum a mean
      at::Tensor& grad = p.shard.mutable_grad();
      if (grad.defined()) {
        grad.add_(block);
        give_back(std::move(block));
      } else {
        grad = block;
      }
    }
  }
  for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
  reset_backward();
  account();
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

void ShardedState::reset_backward() {
  for (auto& p : params_) p.ready = false;
  for (auto& u : units_) {
    u.ready = 0;
    u.launched = false;
  }
  next_reduction_ = 0;
  finalize_queued_ = false;
}

}  // namespace chorus::detail
