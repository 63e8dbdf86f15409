// The built-in comm hooks and the model averager (Note [DDP reducer] says when hooks run). Each
// hook returns a future whose value is the bucket's averaged gradients as a flat tensor.
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cmath>

#include "chorus/ddp.h"

namespace chorus {

using detail::concat;
using Future = c10::ivalue::Future;
using FuturePtr = c10::intrusive_ptr<Future>;

namespace {

// A future completed by an asynchronous collective: with `value` once it finished.
FuturePtr future_of(const std::shared_ptr<TensorWork>& work, at::Tensor value) {
  auto fut = c10::make_intrusive<Future>(c10::TensorType::get());
  work->on_finish([fut, value](std::exception_ptr error) {
    if (error)
      fut->setError(error);
    else
      fut->markCompleted(c10::IValue(value));
  });
  return fut;
}

FuturePtr completed(at::Tensor value) {
  auto fut = c10::make_intrusive<Future>(c10::TensorType::get());
  fut->markCompleted(c10::IValue(std::move(value)));
  return fut;
}

// The averaged tensor, asynchronously: Mean reduces in f32 even for half types.
FuturePtr average_async(ProcessGroup& g, at::Tensor t) { return future_of(g.all_reduce_async(t, ReduceOp::Mean), t); }

CommHook compress_hook(std::shared_ptr<ProcessGroup> group, at::ScalarType type) {
  return [group, type](GradBucket& bucket) {
    ProcessGroup& g = group_or_default(group);
    at::Tensor compressed = bucket.buffer().to(type);
    const auto original = bucket.buffer().scalar_type();
    auto fut = average_async(g, compressed);
    return fut->then([original](Future& f) { return c10::IValue(f.value().toTensor().to(original)); },
                     c10::TensorType::get());
  };
}

CommHook compress_wrapper(CommHook inner, at::ScalarType type) {
  return [inner = std::move(inner), type](GradBucket& bucket) {
    const auto original = bucket.buffer().scalar_type();
    at::Tensor compressed = bucket.buffer().to(type);
    std::vector<at::Tensor> views;
    for (size_t i = 0; i < bucket.gradients().size(); ++i)
      views.push_back(
          compressed.narrow(0, bucket.offset(i), bucket.gradients()[i].numel()).view(bucket.gradients()[i].sizes()));
    GradBucket half(bucket.index(), bucket.is_last(), compressed, views, bucket.parameters());
    return inner(half)->then([original](Future& f) { return c10::IValue(f.value().toTensor().to(original)); },
                             c10::TensorType::get());
  };
}

// Orthonormal columns spanning m's (n x r, n >= r), in place: Householder QR, which stays
// orthonormal where Gram-Schmidt does not (gradients of small batches are rank-deficient, and the
// leftover columns are rounding noise). Identical bits on every rank: the input is averaged.
void orthogonalize(at::Tensor& m) { m.copy_(std::get<0>(at::linalg_qr(m, "reduced"))); }

at::ScalarType math_type(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? at::kFloat : t.scalar_type();
}

// Blocking average over the group (PowerSGD's steps are sequential anyway).
void average_(ProcessGroup& g, at::Tensor& t) { g.all_reduce_(t, ReduceOp::Mean); }

}  // namespace

CommHook allreduce_hook(std::shared_ptr<ProcessGroup> group) {
  return [group](GradBucket& bucket) { return average_async(group_or_default(group), bucket.buffer()); };
}

CommHook fp16_compress_hook(std::shared_ptr<ProcessGroup> group) { return compress_hook(std::move(group), at::kHalf); }
CommHook bf16_compress_hook(std::shared_ptr<ProcessGroup> group) {
  return compress_hook(std::move(group), at::kBFloat16);
}
CommHook fp16_compress_wrapper(CommHook inner) { return compress_wrapper(std::move(inner), at::kHalf); }
CommHook bf16_compress_wrapper(CommHook inner) { return compress_wrapper(std::move(inner), at::kBFloat16); }

// Note [PowerSGD]: each gradient matrix M (n x m, from tensors of 2+ dims) is approximated as
// P Q^T with rank r: P = M Q, averaged and orthogonalized; Q = M^T P, averaged; M ~ P Q^T. With
// error feedback, what the approximation lost is added to the next iteration's gradient; with
// warm start, Q carries over between iterations. Vectors (biases) and matrices too small to gain
// are averaged as they are. The first start_powerSGD_iter iterations are plain averages.
namespace {

// Before start_powerSGD_iter: a plain average, and the iteration count moves on.
FuturePtr plain_while_warming_up(PowerSGDState& state, GradBucket& bucket, ProcessGroup& g) {
  if (state.iter >= state.start_powerSGD_iter) return FuturePtr();
  if (bucket.is_last()) ++state.iter;
  return average_async(g, bucket.buffer());
}

// The rank-`rank` average over the group of m (n x k, a floating type CPU kernels factor):
// P = avg(m Q), orthonormalized; Q' = avg(m^T P); returns P Q'^T. q is the warm start, seeded
// identically on every rank when it must be made (first time, shape change, or no warm start),
// and becomes Q' orthonormalized.
at::Tensor low_rank_average(ProcessGroup& g, const PowerSGDState& state, at::Tensor& q, uint64_t seed,
                            const at::Tensor& m, int64_t rank) {
  if (!q.defined() || !state.warm_start || q.size(0) != m.size(1)) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    q = at::randn({m.size(1), rank}, gen, at::TensorOptions().dtype(m.scalar_type()));
    orthogonalize(q);
  }
  at::Tensor p = at::mm(m, q);
  average_(g, p);
  orthogonalize(p);
  at::Tensor new_q = at::mm(m.t(), p);
  average_(g, new_q);
  at::Tensor approx = at::mm(p, new_q.t());
  q = new_q;
  orthogonalize(q);
  return approx;
}

void check_state(const std::shared_ptr<PowerSGDState>& state, const char* hook) {
  if (!state) throw InvalidArgument(concat(hook, ": the state is null"));
  if (state->matrix_approximation_rank < 1)
    throw InvalidArgument(
        concat(hook, ": matrix_approximation_rank must be >= 1 (it is ", state->matrix_approximation_rank, ")"));
}

// Error feedback: adds to x what compression lost of it last time, and returns x as it then is
// (undefined without error feedback)...
at::Tensor add_error(PowerSGDState& state, size_t key, at::Tensor& x) {
  if (!state.use_error_feedback) return at::Tensor();
  auto& e = state.error[key];
  if (e.defined() && e.sizes() == x.sizes()) x.add_(e);
  return x.clone();
}
// ... and keeps what compression lost of it this time.
void keep_error(PowerSGDState& state, size_t key, const at::Tensor& before, const at::Tensor& after) {
  if (state.use_error_feedback) state.error[key] = before - after;
}

// What both PowerSGD hooks do around their compression: the state checked when the hook is
// made, plain averaging while warming up, then average(g, bucket) replaces the bucket's values
// with their compressed average, and the iteration counts.
template <class Average>
CommHook powerSGD_frame(std::shared_ptr<PowerSGDState> state, const char* hook, Average average) {
  check_state(state, hook);
  return [state, average](GradBucket& bucket) -> FuturePtr {
    ProcessGroup& g = group_or_default(state->group);
    if (auto plain = plain_while_warming_up(*state, bucket, g)) return plain;
    at::NoGradGuard no_grad;
    average(g, bucket);
    if (bucket.is_last()) ++state->iter;
    return completed(bucket.buffer());
  };
}

}  // namespace

CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state) {
  return powerSGD_frame(state, "powerSGD_hook", [state](ProcessGroup& g, GradBucket& bucket) {
    at::Tensor& buffer = bucket.buffer();
    const size_t key = bucket.index();
    const at::Tensor before = add_error(*state, key, buffer);
    const int64_t r = state->matrix_approximation_rank;
    const auto& grads = bucket.gradients();
    for (size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor& grad = grads[i];
      const int64_t n = grad.dim() >= 2 ? grad.size(0) : 0, m = n ? grad.numel() / n : 0;
      const int64_t rank = std::min({r, n, m});
      if (!n || !m || double(n * m) < state->min_compression_rate * double((n + m) * rank)) {
        // Vectors and matrices too small to gain: averaged as they are.
        at::Tensor flat = grad.reshape({-1}).contiguous();
        average_(g, flat);
        grad.copy_(flat.view(grad.sizes()));
        continue;
      }
      // Half-precision buckets (under a compression wrapper) are factored in f32: CPU kernels
      // for mm and QR do not take f16.
      at::Tensor matrix = grad.view({n, m});
      const size_t slot = key * 1000003 + i;
      matrix.copy_(low_rank_average(g, *state, state->q[slot], state->seed + slot, matrix.to(math_type(matrix)), rank));
    }
    keep_error(*state, key, before, buffer);
  });
}

// The whole bucket as one square-ish matrix (zero padded): one P and one Q per bucket.
CommHook batched_powerSGD_hook(std::shared_ptr<PowerSGDState> state) {
  return powerSGD_frame(state, "batched_powerSGD_hook", [state](ProcessGroup& g, GradBucket& bucket) {
    at::Tensor& buffer = bucket.buffer();
    const size_t key = bucket.index();
    const int64_t total = buffer.numel();
    const int64_t side = int64_t(std::ceil(std::sqrt(double(total))));
    at::Tensor mtx = at::zeros({side * side}, buffer.options().dtype(math_type(buffer)));
    mtx.narrow(0, 0, total).copy_(buffer);
    const at::Tensor before = add_error(*state, key, mtx);
    at::Tensor square = mtx.view({side, side});
    const int64_t rank = std::min<int64_t>(state->matrix_approximation_rank, side);
    square.copy_(low_rank_average(g, *state, state->q[key], state->seed + key, square, rank));
    keep_error(*state, key, before, mtx);
    buffer.copy_(mtx.narrow(0, 0, total));
  });
}

CommHook post_localSGD_hook(std::shared_ptr<PostLocalSGDState> state) {
  if (!state) throw InvalidArgument("post_localSGD_hook: the state is null");
  return [state](GradBucket& bucket) {
    const bool global = state->iter < state->start_localSGD_iter || !state->subgroup;
    if (bucket.is_last()) ++state->iter;
    ProcessGroup& g = global ? group_or_default(state->group) : *state->subgroup;
    return average_async(g, bucket.buffer());
  };
}

PeriodicModelAverager::PeriodicModelAverager(int period, int warmup_steps, std::shared_ptr<ProcessGroup> group)
    : period_(period), warmup_(warmup_steps), group_(std::move(group)) {
  if (period_ < 1) throw InvalidArgument(concat("PeriodicModelAverager: period must be >= 1, not ", period_));
  if (warmup_ < 0) throw InvalidArgument("PeriodicModelAverager: warmup_steps must be >= 0");
}

void PeriodicModelAverager::average_parameters(const std::vector<at::Tensor>& params) {
  const int64_t step = step_++;
  if (step < warmup_ || (step - warmup_) % period_ != 0) return;
  ProcessGroup& g = group_or_default(group_);
  at::NoGradGuard no_grad;
  // One flat buffer per dtype: one collective however many parameters.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& p : params) by_type[p.scalar_type()].push_back(p);
  for (auto& [type, ps] : by_type) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& p : ps) flat_parts.push_back(p.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    g.all_reduce_(flat, at::isFloatingType(type) ? ReduceOp::Mean : ReduceOp::Sum);
    int64_t off = 0;
    for (auto& p : ps) {
      at::Tensor target = p;
      target.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }
}

}  // namespace chorus
