// Note [Sharded units]
// A unit is a set of parameters gathered and freed together: the parameters of a submodule listed
// in ShardedOptions::units (the innermost listed one holding the parameter), or of the root unit
// (all the others). Units need no hook in the module: the first operator that uses a parameter
// (Note [Sharded parameters]) gathers the parameter's whole unit, one all-gather per parameter
// straight into the storage the module's tensor shows (rank-major shards: W * S elements, of
// which the tensor sees the first N).
//   - Forward: the order in which units are first used is recorded. When forward moves on to
//     another unit, FullShard frees the one before (the root unit stays to the end of forward:
//     models use it around the others); at the end of forward FullShard frees every unit and
//     ShardGradOp keeps them until its backward ends. With prefetch, using a unit starts the
//     all-gather of the unit the previous forward used next, so it travels while this one
//     computes.
//   - Backward runs the units in the reverse order: an operator of a freed unit gathers it again
//     (FullShard), and prefetch starts the unit before it in forward order. A unit is freed once
//     its gradients left for reduction (Note [Sharded backward] in backward.cc).
// Collectives follow the order in which this rank's model uses its units, so every rank issues
// the same collectives as long as the ranks run the same model code (as for FSDP); if they do
// not, chorus's call check raises CollectiveMismatch instead of a hang.
#include "sharded/state.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "sharded/param_kernel.h"
#include "sharded/shard_range.h"
#include "tensor_util.h"

namespace chorus::detail {

namespace {

bool in_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

uint64_t next_id() {
  static std::atomic<uint64_t> next{0};
  return next++;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * int64_t(t.element_size()) : 0; }

}  // namespace

ShardedState::ShardedState(std::shared_ptr<ProcessGroup> group, ShardingStrategy strategy, bool prefetch)
    : group_(std::move(group)), id_(next_id()), strategy_(strategy), prefetch_(prefetch) {}

ShardedState::~ShardedState() {
  hooks_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    forget_sharded(params_[i].storage.get());
    params_[i].held = false;
    free_param(i);                                  // a prefetch in flight lands first
    fill_storage(*params_[i].storage, nullptr, 0);  // the module keeps the tensor, not our buffers
  }
}

void ShardedState::shard(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  world_ = group_->size();
  rank_ = group_->rank();
  // Units: each listed module must be in the module; a parameter goes to the innermost one.
  auto modules = module.named_modules("", /*include_self=*/true);
  std::vector<std::string> unit_names;
  for (const auto& u : units) {
    if (!u) throw InvalidArgument("ShardedDataParallel: a unit is null");
    std::optional<std::string> found;
    for (const auto& item : modules)
      if (item.value().get() == u.get()) found = item.key();
    if (!found) throw InvalidArgument("ShardedDataParallel: a unit is not a submodule of the module");
    unit_names.push_back(*found);
  }
  units_.push_back(Unit{});  // the root unit
  std::unordered_map<const c10::TensorImpl*, size_t> unit_of;
  for (const auto& item : modules) {  // outermost first, so inner units overwrite
    for (size_t k = 0; k < units.size(); ++k) {
      if (units[k].get() != item.value().get()) continue;
      size_t u = units_.size();
      units_.push_back(Unit{unit_names[k], {}, {}, 0, false, nullptr});
      for (const auto& p : item.value()->parameters(true)) unit_of[p.unsafeGetTensorImpl()] = u;
    }
  }

  at::NoGradGuard no_grad;
  const auto self = shared_from_this();
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  for (const auto& item : module.named_parameters(true)) {
    at::Tensor p = item.value();
    if (auto it = seen.find(p.unsafeGetTensorImpl()); it != seen.end()) {  // tied: sharded once, first name
      params_[it->second].aliases.push_back(item.key());
      continue;
    }
    seen.emplace(p.unsafeGetTensorImpl(), params_.size());
    if (!p.device().is_cpu())
      throw InvalidArgument(concat("ShardedDataParallel: parameter '", item.key(), "' is on ", p.device().str(),
                                   "; this build shards parameters on the CPU"));
    if (p.is_sparse() || !p.is_contiguous()) p = p.contiguous();
    group_->broadcast_(p, 0);  // rank 0's values win
    Param s;
    s.name = item.key();
    s.param = item.value();
    s.numel = p.numel();
    s.shard_numel = shard_numel(s.numel, world_);
    s.shard = at::zeros({s.shard_numel}, p.options().requires_grad(false));
    const ShardRange mine = shard_range(s.numel, s.shard_numel, rank_);
    if (mine.size() > 0) s.shard.narrow(0, 0, mine.size()).copy_(p.reshape({-1}).narrow(0, mine.begin, mine.size()));
    s.shard.set_requires_grad(p.requires_grad());
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    s.unit = it == unit_of.end() ? 0 : it->second;
    const size_t index = params_.size();
    s.storage = make_sharded(s.param, self, index);  // the full values go with the old storage
    units_[s.unit].params.push_back(index);
    if (p.requires_grad()) units_[s.unit].reduced.push_back(index);
    params_.push_back(std::move(s));
  }
  for (const auto& item : module.named_buffers(true)) {
    at::Tensor b = item.value();
    group_->broadcast_(b, 0);
    buffers_.push_back(b);
  }
  // Gradient hooks (backward.cc), on accumulators this state keeps alive.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].param.requires_grad()) continue;
    hooks_.add(params_[i].param, weak_from_this(), &ShardedState::on_grad_ready, i);
  }
  seen_in_forward_.assign(units_.size(), 0);
  int64_t largest = 0;
  for (const auto& u : units_) {
    int64_t b = 0;
    for (size_t i : u.params) b += world_ * params_[i].shard_numel * int64_t(params_[i].shard.element_size());
    largest = std::max(largest, b);
  }
  spare_limit_ = 2 * largest;  // the unit in use and the one prefetched
}

bool ShardedState::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_forward_ || finalize_queued_ || in_backward();
}

void ShardedState::touch(size_t i, const std::string& op) {
  std::lock_guard<std::mutex> lock(mu_);
  Param& p = params_[i];
  const size_t u = p.unit;
  if (in_backward()) {
    queue_finalize();
    if (!p.full.defined()) {
      gather_unit(u);
      // Backward runs units in the reverse of forward order: the one before this is next.
      auto at = std::find(forward_order_.begin(), forward_order_.end(), u);
      if (prefetch_ && at != forward_order_.end() && at != forward_order_.begin()) prefetch_unit(*(at - 1));
    }
    return;
  }
  if (in_forward_) {
    if (!seen_in_forward_[u]) {
      seen_in_forward_[u] = 1;
      forward_order_.push_back(u);
    }
    if (current_ != u) {
      if (strategy_ == ShardingStrategy::FullShard && current_ && *current_ != 0) free_unit(*current_);
      current_ = u;
      gather_unit(u);
      // The unit the previous forward used after this one travels while this one computes.
      auto at = std::find(last_order_.begin(), last_order_.end(), u);
      if (prefetch_ && at != last_order_.end() && at + 1 != last_order_.end()) prefetch_unit(*(at + 1));
    } else if (!p.full.defined()) {
      gather_unit(u);
    }
    return;
  }
  if (p.held) return;  // GatheredParameters gathered it
  throw InvalidArgument(
      concat("ShardedDataParallel: parameter '", p.name, "' is sharded over the group's ", world_,
             " ranks (this rank holds elements of it only), so ", op,
             " cannot use it here. Run the module inside forward: sdp.forward([&] { return model->forward(x); }); "
             "to read or change the full values outside it, use chorus::GatheredParameters; to save them, "
             "sdp.full_state_dict()"));
}

void ShardedState::begin_forward() {
  rethrow_deferred();
  std::lock_guard<std::mutex> lock(mu_);
  if (in_forward_) throw InvalidArgument("ShardedDataParallel::forward: already inside forward of this module");
  if (in_backward()) throw InvalidArgument("ShardedDataParallel::forward: called during a backward pass");
  // A backward that failed before its end, or a forward whose backward never came (ShardGradOp
  // kept its units): start clean.
  if (finalize_queued_) {
    for (auto& p : params_) {
      if (p.reduction) try {
          p.reduction->wait();
        } catch (...) {  // that backward already raised its error
        }
      give_back(std::move(p.reduce_in));
      p.reduce_in.reset();
      p.reduce_out.reset();
      p.reduction.reset();
    }
    reset_backward();
  }
  for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
  in_forward_ = true;
  forward_grad_ = at::GradMode::is_enabled();
  forward_order_.clear();
  std::fill(seen_in_forward_.begin(), seen_in_forward_.end(), 0);
  current_.reset();
  if (prefetch_ && !last_order_.empty()) prefetch_unit(last_order_.front());
}

void ShardedState::end_forward(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  in_forward_ = false;
  current_.reset();
  last_order_ = forward_order_;
  if (!ok || !forward_grad_ || strategy_ == ShardingStrategy::FullShard)
    for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
  // The backward of this forward reduces units in the reverse order, then those it did not use.
  reduction_order_.assign(forward_order_.rbegin(), forward_order_.rend());
  for (size_t u = 0; u < units_.size(); ++u)
    if (!seen_in_forward_[u]) reduction_order_.push_back(u);
}

void ShardedState::prepare_load() {
  if (busy())
    throw InvalidArgument(
        "load_checkpoint: a sharded module is in its forward or backward; load before forward or after backward");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : params_)
    if (p.held)
      throw InvalidArgument(
          concat("load_checkpoint: parameter '", p.name, "' is held by a GatheredParameters; load after it exits"));
  for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
}

void ShardedState::gather_unit(size_t u) {
  for (size_t i : units_[u].params) gather_param(i);
}

void ShardedState::prefetch_unit(size_t u) {
  for (size_t i : units_[u].params) {
    Param& p = params_[i];
    if (p.full.defined() || p.gathering) continue;
    p.incoming = take_buffer(world_ * p.shard_numel, p.shard.options());
    p.gathering = group_->all_gather_into_async(p.incoming, p.shard.detach());
  }
}

void ShardedState::free_unit(size_t u) {
  for (size_t i : units_[u].params) free_param(i);
}

void ShardedState::gather_param(size_t i) {
  Param& p = params_[i];
  if (p.full.defined()) return;
  if (p.gathering) {
    auto work = std::move(p.gathering);
    p.gathering.reset();
    p.full = std::move(p.incoming);
    p.incoming.reset();
    work->wait();
  } else {
    p.full = take_buffer(world_ * p.shard_numel, p.shard.options());
    group_->all_gather_into(p.full, p.shard.detach());
  }
  fill_storage(*p.storage, p.full.data_ptr(), size_t(p.numel) * p.full.element_size());
  account();
}

void ShardedState::free_param(size_t i) {
  Param& p = params_[i];
  if (p.held) return;
  if (p.gathering) {  // a prefetch nobody used: let it land, then drop it
    try {
      p.gathering->wait();
    } catch (...) {  // a failed group fails its next collective again; this runs in destructors
    }
    p.gathering.reset();
    give_back(std::move(p.incoming));
  }
  if (!p.full.defined()) return;
  fill_storage(*p.storage, nullptr, 0);
  give_back(std::move(p.full));
  p.full.reset();
  account();
}

at::Tensor ShardedState::take_buffer(int64_t numel, const at::TensorOptions& options) {
  for (size_t k = 0; k < spare_.size(); ++k) {
    if (spare_[k].numel() != numel || spare_[k].scalar_type() != options.dtype().toScalarType()) continue;
    at::Tensor t = std::move(spare_[k]);
    spare_.erase(spare_.begin() + long(k));
    spare_bytes_ -= bytes_of(t);
    return t;
  }
  return at::empty({numel}, options.requires_grad(false));
}

void ShardedState::give_back(at::Tensor t) {
  if (!t.defined()) return;
  const int64_t b = bytes_of(t);
  while (!spare_.empty() && spare_bytes_ + b > spare_limit_) {  // the oldest go first
    spare_bytes_ -= bytes_of(spare_.front());
    spare_.erase(spare_.begin());
  }
  if (b > spare_limit_) return;
  spare_bytes_ += b;
  spare_.push_back(std::move(t));
}

void ShardedState::account() {
  full_bytes_ = 0;
  full_grad_bytes_ = 0;
  for (const auto& p : params_) {
    full_bytes_ += bytes_of(p.full);
    full_grad_bytes_ += bytes_of(p.param.grad());
  }
  peak_transient_ = std::max(peak_transient_, full_bytes_ + full_grad_bytes_);
}

std::vector<at::Tensor> ShardedState::shards() {
  std::vector<at::Tensor> out;
  for (const auto& p : params_) out.push_back(p.shard);
  return out;
}

torch::OrderedDict<std::string, at::Tensor> ShardedState::named_shards() {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : params_) out.insert(p.name, p.shard);
  return out;
}

torch::OrderedDict<std::string, at::Tensor> ShardedState::full_state_dict(torch::nn::Module& module) {
  if (busy()) throw InvalidArgument("ShardedDataParallel::full_state_dict: called during forward or backward");
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : params_) {  // one parameter at a time onto rank 0
    std::optional<at::Tensor> stacked = group_->gather(p.shard.detach(), 0);
    if (!stacked) continue;
    at::Tensor full = stacked->reshape({-1}).narrow(0, 0, p.numel).reshape(p.param.sizes()).clone();
    out.insert(p.name, full);
    for (const auto& alias : p.aliases) out.insert(alias, full);  // as module.named_parameters() lists it
  }
  if (rank_ == 0)
    for (const auto& item : module.named_buffers(true)) out.insert(item.key(), item.value().detach().clone());
  return out;
}

ShardedDataParallel::MemoryStats ShardedState::memory_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ShardedDataParallel::MemoryStats m;
  for (const auto& p : params_) {
    m.shard_bytes += bytes_of(p.shard);
    m.shard_grad_bytes += bytes_of(p.shard.grad());
    m.full_bytes += bytes_of(p.full);
    m.full_grad_bytes += bytes_of(p.param.grad());
  }
  m.peak_transient_bytes = std::max(peak_transient_, m.full_bytes + m.full_grad_bytes);
  m.cached_bytes = spare_bytes_;
  return m;
}

void ShardedState::reset_peak_memory() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_transient_ = 0;
  account();
}

std::vector<std::pair<std::string, std::vector<std::string>>> ShardedState::unit_layout() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& u : units_) {
    std::vector<std::string> names;
    for (size_t i : u.params) names.push_back(params_[i].name);
    if (!names.empty() || u.name.empty()) out.emplace_back(u.name, std::move(names));
  }
  return out;
}

void ShardedState::defer_error(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!deferred_) deferred_ = std::move(e);
}

void ShardedState::rethrow_deferred() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(e, deferred_);
  }
  if (e) std::rethrow_exception(e);
}

}  // namespace chorus::detail
