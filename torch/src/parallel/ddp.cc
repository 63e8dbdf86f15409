// Note [DDP reducer]
// Parameters are bucketed in reverse registration order (the order backward produces their
// gradients): the first bucket holds up to first_bucket_mb, the others bucket_cap_mb. A post-hook
// on each parameter's gradient accumulator copies the accumulated gradient into its slot of the
// bucket's flat buffer; when a bucket's last slot is filled, that bucket and every later one
// already complete are handed to the comm hook, strictly in bucket order, so every rank issues
// the same collectives in the same order whatever order its gradients came in. The first hook of
// a backward queues a callback that autograd runs when the backward pass ends: it accounts for
// parameters that got no gradient, waits for every bucket's future, and copies the reduced
// values back into the .grad tensors.
//
// The .grad tensors are the bucket slots themselves (allocation-free aliases of the flat
// buffer, which autograd does not treat as views, so optimizers may detach and zero them):
// autograd accumulates straight into the bucket and the default all-reduce reduces in place, so
// a step copies no gradient. A .grad that was replaced (set to None and re-created by autograd,
// say) is copied into its slot once and pointed back at it.
//
// CPU buckets live in the group's symmetric memory (Note [Symmetric memory]): on one host each
// bucket's all-reduce then moves gradients straight between the ranks' buckets, without staging.
#include "chorus/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

#include "groups/placement.h"
#include "groups/tensor_util.h"
#include "parallel/grad_hooks.h"

namespace chorus {

using detail::concat;

struct DistributedDataParallel::Reducer : std::enable_shared_from_this<Reducer> {
  struct Bucket {
    std::vector<size_t> params;     // indices into Reducer::params
    at::Tensor buffer;              // flat, one dtype
    std::vector<at::Tensor> views;  // per parameter, into buffer
    size_t pending = 0;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  std::shared_ptr<ProcessGroup> group;
  DDPOptions options;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<char> ready;
  detail::GradReadyHooks hooks;
  std::vector<at::Tensor> buffers;  // module buffers, for broadcast_buffers
  CommHook hook;
  bool custom_hook = false, backward_seen = false, sync = true, finalizing_queued = false;
  size_t next_launch = 0;
  std::mutex mu;

  void mark_ready(size_t i);
  // Makes params[i].grad its bucket slot, keeping its value (zero when it had none).
  void adopt_grad(size_t i) {
    at::Tensor& slot = buckets[bucket_of[i]].views[slot_of[i]];
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined() && grad.data_ptr() == slot.data_ptr()) return;
    if (grad.defined())
      slot.copy_(grad.reshape(slot.sizes()));
    else
      slot.zero_();
    grad = slot;
  }
  void launch_ready_buckets();
  void finalize();
  void reset();
};

void DistributedDataParallel::Reducer::mark_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu);
  if (!sync) return;  // no_sync: gradients accumulate in .grad
  backward_seen = true;
  if (!finalizing_queued) {
    finalizing_queued = true;
    detail::at_backward_end(weak_from_this(), &Reducer::finalize);
  }
  if (ready[i]) return;  // a parameter used twice in the graph fires once per use
  ready[i] = 1;
  Bucket& b = buckets[bucket_of[i]];
  adopt_grad(i);
  --b.pending;
  launch_ready_buckets();
}

void DistributedDataParallel::Reducer::launch_ready_buckets() {
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
    Bucket& b = buckets[next_launch];
    std::vector<at::Tensor> bucket_params;
    for (size_t i : b.params) bucket_params.push_back(params[i]);
    GradBucket gb(next_launch, next_launch + 1 == buckets.size(), b.buffer, b.views, bucket_params);
    b.future = hook(gb);
    ++next_launch;
  }
}

void DistributedDataParallel::Reducer::reset() {
  std::fill(ready.begin(), ready.end(), 0);
  for (auto& b : buckets) {
    b.pending = b.params.size();
    b.future.reset();
  }
  next_launch = 0;
  finalizing_queued = false;
}

void DistributedDataParallel::Reducer::finalize() {
  std::unique_lock<std::mutex> lock(mu);
  std::string unused;
  for (size_t i = 0; i < params.size(); ++i)
    if (!ready[i]) {
      if (options.find_unused_parameters) {  // contributes what it holds: zero, or what no_sync accumulated
        ready[i] = 1;
        adopt_grad(i);
        --buckets[bucket_of[i]].pending;
      } else {
        unused += concat(unused.empty() ? "" : ", ", names[i]);
      }
    }
  if (options.find_unused_parameters) launch_ready_buckets();
  // Every launched bucket finishes before anything else happens on the group.
  std::exception_ptr error;
  for (size_t k = 0; k < next_launch; ++k) {
    auto& f = buckets[k].future;
    f->wait();
    if (f->hasError() && !error) error = f->exception_ptr();
  }
  if (!unused.empty()) {
    reset();
    throw InvalidArgument(
        concat("DistributedDataParallel: parameter(s) ", unused,
               " got no gradient in this backward pass, so their buckets cannot be reduced; if the model "
               "skips parameters on purpose, construct it with DDPOptions{.find_unused_parameters = true}"));
  }
  if (error) {
    reset();
    std::rethrow_exception(error);
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    Bucket& b = buckets[k];
    at::Tensor reduced = b.future->value().toTensor();
    // The default hook reduced in place; others return a tensor of their own.
    if (reduced.data_ptr() != b.buffer.data_ptr()) b.buffer.copy_(reduced.reshape(b.buffer.sizes()));
    for (size_t s = 0; s < b.params.size(); ++s) {
      at::Tensor& grad = params[b.params[s]].mutable_grad();
      if (!grad.defined() || grad.data_ptr() != b.views[s].data_ptr()) grad = b.views[s];
    }
  }
  reset();
  lock.unlock();
  if (options.broadcast_buffers && !buffers.empty()) {
    at::NoGradGuard no_grad;
    for (auto& t : buffers) group->broadcast_(t, 0);
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, DDPOptions options)
    : module_(std::move(module)), options_(std::move(options)), reducer_(std::make_shared<Reducer>()) {
  if (!module_) throw InvalidArgument("DistributedDataParallel: the module is null");
  group_ = options_.group ? options_.group : default_group();
  Reducer& r = *reducer_;
  r.group = group_;
  r.options = options_;
  for (const auto& item : module_->named_parameters(true)) {
    const at::Tensor& p = item.value();
    if (!p.device().is_cpu())
      throw InvalidArgument(concat("DistributedDataParallel: parameter '", item.key(), "' is on ", p.device().str(),
                                   "; this build keeps replicas in sync on the CPU"));
    if (!p.requires_grad()) continue;
    r.params.push_back(p);
    r.names.push_back(item.key());
  }
  if (r.params.empty())
    throw InvalidArgument("DistributedDataParallel: the module has no parameter that requires a gradient");
  for (const auto& item : module_->named_buffers(true)) r.buffers.push_back(item.value());

  // Same starting point everywhere: rank 0's parameters and buffers.
  {
    at::NoGradGuard no_grad;
    for (const auto& item : module_->named_parameters(true)) {
      at::Tensor t = item.value();
      group_->broadcast_(t, 0);
    }
    for (auto& t : r.buffers) group_->broadcast_(t, 0);
  }

  // Buckets, in reverse registration order; a bucket holds one dtype.
  const size_t n = r.params.size();
  r.bucket_of.assign(n, 0);
  r.slot_of.assign(n, 0);
  r.ready.assign(n, 0);
  std::vector<std::vector<size_t>> layout;
  size_t bytes = 0;
  for (size_t k = n; k-- > 0;) {
    const at::Tensor& p = r.params[k];
    const double cap = (layout.size() <= 1 ? options_.first_bucket_mb : options_.bucket_cap_mb) * 1024 * 1024;
    const bool fits =
        !layout.empty() && bytes < size_t(cap) && r.params[layout.back().front()].scalar_type() == p.scalar_type();
    if (!fits) {
      layout.emplace_back();
      bytes = 0;
    }
    layout.back().push_back(k);
    bytes += size_t(p.numel()) * p.element_size();
  }
  for (auto& idx : layout) {
    Reducer::Bucket b;
    b.params = idx;
    int64_t total = 0;
    for (size_t i : idx) total += r.params[i].numel();
    b.buffer = group_->alloc_symmetric(total, r.params[idx[0]].options().requires_grad(false));
    int64_t off = 0;
    for (size_t s = 0; s < idx.size(); ++s) {
      const at::Tensor& p = r.params[idx[s]];
      b.views.push_back(detail::alias_of(b.buffer, p.sizes(), off));
      r.bucket_of[idx[s]] = r.buckets.size();
      r.slot_of[idx[s]] = s;
      off += p.numel();
    }
    b.pending = idx.size();
    r.buckets.push_back(std::move(b));
  }
  for (size_t i = 0; i < n; ++i) r.adopt_grad(i);
  r.hook = allreduce_hook(group_);
  detail::register_replicas(r.params, group_);
  for (size_t i = 0; i < n; ++i) r.hooks.add(r.params[i], std::weak_ptr<Reducer>(reducer_), &Reducer::mark_ready, i);
}

DistributedDataParallel::~DistributedDataParallel() {
  detail::forget_replicas(reducer_->params);
  reducer_->hooks.clear();
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : reducer_->buckets) out.push_back(b.params);
  return out;
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(reducer_->mu);
  if (reducer_->custom_hook)
    throw InvalidArgument("DistributedDataParallel::register_comm_hook: a comm hook is already registered");
  if (reducer_->backward_seen)
    throw InvalidArgument("DistributedDataParallel::register_comm_hook: register the hook before the first backward");
  if (!hook) throw InvalidArgument("DistributedDataParallel::register_comm_hook: the hook is empty");
  reducer_->hook = std::move(hook);
  reducer_->custom_hook = true;
}

void DistributedDataParallel::sync_buffers() {
  at::NoGradGuard no_grad;
  for (auto& t : reducer_->buffers) group_->broadcast_(t, 0);
}

NoSyncGuard::NoSyncGuard(DistributedDataParallel* ddp) {
  if (!ddp) return;
  std::shared_ptr<DistributedDataParallel::Reducer> reducer = ddp->reducer_;
  std::lock_guard<std::mutex> lock(reducer->mu);
  const bool previous = std::exchange(reducer->sync, false);
  restore_ = [reducer, previous] {
    std::lock_guard<std::mutex> lock(reducer->mu);
    reducer->sync = previous;
  };
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept : restore_(std::move(other.restore_)) {
  other.restore_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (restore_) restore_();
}

}  // namespace chorus
