// Note [Sharded backward]
// Autograd accumulates each parameter's full gradient into the module tensor's .grad, as for any
// leaf; a post-hook on its AccumulateGrad tells the state it arrived. When every parameter of a
// unit that wants a gradient has one, the unit's reduction starts: the full gradients are copied
// rank-major into one buffer (rank r's block holds every parameter's elements [r*S, (r+1)*S),
// zero-padded), the .grad tensors are dropped, FullShard frees the unit's parameters, and a
// reduce-scatter (sum) is queued on the group's executor, where it runs while autograd goes on
// with the units before. Reductions start strictly in reduction order (the reverse of forward's,
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

#include "state.h"

namespace chorus::detail {

void ShardedState::queue_finalize() {
  if (finalize_queued_) return;
  finalize_queued_ = true;
  std::weak_ptr<ShardedState> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto s = self.lock()) s->finalize_backward();
  });
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
  if (sync_ && !unit.reduced.empty()) {
    at::NoGradGuard no_grad;
    int64_t block = 0;
    for (size_t i : unit.reduced) block += params_[i].shard_numel;
    const at::Tensor& first = params_[unit.reduced.front()].shard;
    at::Tensor flat = at::zeros({world_ * block}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t i : unit.reduced) {
      Param& p = params_[i];
      at::Tensor grad = p.param.grad();
      if (grad.defined()) {
        at::Tensor g = grad.reshape({-1});
        for (int r = 0; r < world_; ++r) {
          const int64_t begin = std::min<int64_t>(p.numel, r * p.shard_numel);
          const int64_t end = std::min<int64_t>(p.numel, begin + p.shard_numel);
          if (end > begin) flat.narrow(0, r * block + offset, end - begin).copy_(g.narrow(0, begin, end - begin));
        }
        p.param.mutable_grad().reset();
      }
      offset += p.shard_numel;
    }
    unit.reduction = group_->reduce_scatter_async(flat, ReduceOp::Sum);
    peak_transient_ =
        std::max(peak_transient_, full_bytes_ + full_grad_bytes_ + flat.numel() * int64_t(flat.element_size()));
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
    Unit& unit = units_[u];
    if (!unit.reduction) continue;
    auto work = std::move(unit.reduction);
    unit.reduction.reset();
    at::Tensor block;
    try {
      block = work->result().at(0);
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    if (error) continue;
    block.div_(world_);  // the one division that makes the sum a mean
    int64_t offset = 0;
    for (size_t i : unit.reduced) {
      Param& p = params_[i];
      at::Tensor g = block.narrow(0, offset, p.shard_numel);
      at::Tensor& grad = p.shard.mutable_grad();
      if (grad.defined())
        grad.add_(g);
      else
        grad = g.clone();
      offset += p.shard_numel;
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
    u.reduction.reset();
  }
  next_reduction_ = 0;
  finalize_queued_ = false;
}

}  // namespace chorus::detail
