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
#include "parallel/grad_hooks.h"
#include "parallel/sharded/state.h"

namespace chorus::detail {

int64_t ShardedUnit::gathered_bytes(int world) const {
  int64_t b = 0;
  for (const ShardedParam* p : params) b += world * p->shard_numel * int64_t(p->shard.element_size());
  return b;
}

void ShardedUnit::note_ready(ShardedParam& p, ShardingContext& c) {
  p.note_grad(c);
  if (p.ready) return;
  p.ready = true;
  ++ready_;
}

void ShardedUnit::launch_reduction(ShardingContext& c, bool sync, bool reshard) {
  if (launched_) return;
  launched_ = true;
  if (sync) {
    at::NoGradGuard no_grad;
    int64_t in_flight = 0;
    for (ShardedParam* p : reduced) in_flight += p->start_reduction(c);
    c.memory.add(0, 0, in_flight);
  }
  if (reshard) free(c);
}

void ShardedUnit::finish_reduction(ShardingContext& c, std::exception_ptr& error) {
  at::NoGradGuard no_grad;
  for (ShardedParam* p : reduced) {
    if (error) {
      p->abandon_reduction(c);
      continue;
    }
    try {
      p->finish_reduction(c);
    } catch (...) {
      error = std::current_exception();
    }
  }
}

void ShardedUnit::reset_backward() {
  for (ShardedParam* p : params) p->ready = false;
  ready_ = 0;
  launched_ = false;
}

void ShardedState::enter_backward() {
  if (state_ == TrainingState::Backward) return;
  state_ = TrainingState::Backward;
  at_backward_end(weak_from_this(), &ShardedState::finalize_backward);
}

bool ShardedState::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(sync_, sync);
}

void ShardedState::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  enter_backward();
  ShardedParam& p = *params_[i];
  units_[p.unit].note_ready(p, ctx_);
  launch_ready_reductions();
}

void ShardedState::launch_ready_reductions() {
  while (next_reduction_ < reduction_order_.size()) {
    ShardedUnit& unit = units_[reduction_order_[next_reduction_]];
    if (!unit.complete()) return;
    unit.launch_reduction(ctx_, sync_, reshards_after_forward());
    ++next_reduction_;
  }
}

void ShardedState::finalize_backward() {
  std::unique_lock<std::mutex> lock(mu_);
  std::exception_ptr error;
  try {
    for (; next_reduction_ < reduction_order_.size(); ++next_reduction_)
      units_[reduction_order_[next_reduction_]].launch_reduction(ctx_, sync_, reshards_after_forward());
  } catch (...) {
    error = std::current_exception();
  }
  for (size_t u : reduction_order_) units_[u].finish_reduction(ctx_, error);
  free_all();
  reset_backward();
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

void ShardedState::abandon_backward() {
  for (auto& p : params_) p->abandon_reduction(ctx_);
  reset_backward();
}

void ShardedState::reset_backward() {
  for (auto& u : units_) u.reset_backward();
  next_reduction_ = 0;
  state_ = TrainingState::Idle;
}

}  // namespace chorus::detail
