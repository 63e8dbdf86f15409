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
// The objects, as FSDP2's: a ShardedParam (param.h) gathers, frees, reduces and holds one
// parameter; a ShardedUnit (unit.h) does it for its parameters together; this ShardedState keeps
// the training state and the orders, and the ShardingContext they share holds the group, the
// buffer cache and the memory ledger (byte counts kept as buffers come and go).
// Collectives follow the order in which this rank's model uses its units, so every rank issues
// the same collectives as long as the ranks run the same model code (as for FSDP); if they do
// not, chorus's call check raises CollectiveMismatch instead of a hang.
#include "parallel/sharded/state.h"

#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "groups/placement.h"
#include "groups/tensor_util.h"
#include "parallel/sharded/param_kernel.h"

namespace chorus::detail {

namespace {

bool in_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

uint64_t next_id() {
  static std::atomic<uint64_t> next{0};
  return next++;
}

}  // namespace

ShardedState::ShardedState(std::shared_ptr<ProcessGroup> group, ShardingStrategy strategy, bool prefetch)
    : id_(next_id()), strategy_(strategy), prefetch_(prefetch) {
  ctx_.group = std::move(group);
  ctx_.world = ctx_.group->size();
  ctx_.rank = ctx_.group->rank();
}

ShardedState::~ShardedState() {
  hooks_.clear();
  for (auto& p : params_) {
    forget_shard(p->storage.get());  // operators on the tensor now throw
    p->held = false;
    p->free(ctx_);                          // a prefetch in flight lands first
    fill_storage(*p->storage, nullptr, 0);  // the module keeps the tensor, not our buffers
  }
}

// Note [Joining a sharded job]: a process that joins an elastic job running in process makes its
// ShardedDataParallel while the survivors move theirs onto the same new group (regroup). Both
// begin with the same agreement, whether any rank moves; if one does, the new module takes no
// values from rank 0 (its values come from the commit restored next), so that both issue the
// same collectives after it: the arena's allocation only.
bool ShardedState::agree_regrouping(bool mine) {
  int64_t flag = mine ? 1 : 0;
  std::vector<int64_t> all(size_t(ctx_.world));
  ctx_.group->communicator().all_gather(&flag, all.data(), 1, DataType::Int64);
  return std::find(all.begin(), all.end(), 1) != all.end();
}

void ShardedState::shard(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  const std::vector<size_t> unit_of = assign_units(module, units);
  joining_ = agree_regrouping(false);
  at::NoGradGuard no_grad;
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  size_t k = 0;
  for (const auto& item : module.named_parameters(true)) {
    const at::Tensor& p = item.value();
    const size_t unit = unit_of[k++];
    if (auto it = seen.find(p.unsafeGetTensorImpl()); it != seen.end()) {  // tied: sharded once, first name
      params_[it->second]->aliases.push_back(item.key());
      continue;
    }
    seen.emplace(p.unsafeGetTensorImpl(), params_.size());
    add_param(item.key(), p, unit);
  }
  if (!joining_)
    for (const auto& item : module.named_buffers(true)) {
      at::Tensor b = item.value();
      ctx_.group->broadcast_(b, 0);  // rank 0's values win
    }
  arm();
}

void ShardedState::arm() {
  for (size_t i = 0; i < params_.size(); ++i)  // gradient hooks (backward.cc)
    if (params_[i]->param.requires_grad())
      hooks_.add(params_[i]->param, weak_from_this(), &ShardedState::on_grad_ready, i);
  seen_in_forward_.assign(units_.size(), 0);
  // Note [Sharded buffers in symmetric memory]: the arena holds the two largest units gathered at
  // once (the one in use and the one prefetched) and every parameter's reduced block.
  int64_t largest = 0, first = 0, second = 0, blocks = 0;
  for (const auto& u : units_) {
    largest = std::max(largest, u.gathered_bytes(ctx_.world));
    int64_t b = 0;
    for (const ShardedParam* p : u.params) {
      b += SymmetricArena::footprint(ctx_.world * p->shard_numel, p->shard.options());
      blocks += SymmetricArena::footprint(p->shard_numel, p->shard.options());
    }
    second = std::max(second, std::min(b, first));
    first = std::max(first, b);
  }
  ctx_.buffers.set_limit(2 * largest);  // the unit in use and the one prefetched
  if (ctx_.world > 1 && first > 0)
    ctx_.buffers.set_arena(ctx_.group->alloc_symmetric(first + second + blocks, at::kByte));
}

void ShardedState::regroup(std::shared_ptr<ProcessGroup> group) {
  // A step the failure broke off leaves its state behind (a backward whose end never came stays
  // Backward); it is dropped below. Only a backward still running here is a misuse.
  if (in_backward()) throw InvalidArgument("elastic::run: called during a backward pass");
  check_not_held("elastic::run");
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.clear();
  ctx_.group = std::move(group);
  ctx_.world = ctx_.group->size();
  ctx_.rank = ctx_.group->rank();
  agree_regrouping(true);  // Note [Joining a sharded job]
  std::vector<std::unique_ptr<ShardedParam>> old;
  old.swap(params_);
  for (auto& p : old) {  // as the destructor: what the failed group had in flight is dropped
    forget_shard(p->storage.get());
    p->abandon_reduction(ctx_);
    p->free(ctx_);
    fill_storage(*p->storage, nullptr, 0);
  }
  for (auto& u : units_) {
    u.params.clear();
    u.reduced.clear();
    u.reset_backward();
  }
  ctx_.buffers = BufferCache();
  ctx_.memory = MemoryLedger();
  for (auto& p : old) {
    auto moved = std::make_unique<ShardedParam>(p->name, p->param, p->numel, p->shard, p->unit, ctx_);
    moved->aliases = p->aliases;
    adopt(std::move(moved));
  }
  state_ = TrainingState::Idle;
  forward_order_.clear();
  current_.reset();
  reduction_order_.clear();
  next_reduction_ = 0;
  deferred_ = nullptr;
  arm();
}

// Makes the units (the root unit first) and returns the unit of each entry of
// module.named_parameters(): the innermost listed module holding it, else the root unit.
std::vector<size_t> ShardedState::assign_units(torch::nn::Module& module,
                                               const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  units_.emplace_back("");
  std::unordered_map<const c10::TensorImpl*, size_t> unit_of;
  for (const auto& u : units)
    if (!u) throw InvalidArgument("ShardedDataParallel: a unit is null");
  std::vector<bool> found(units.size(), false);
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {  // outermost first: inner ones win
    for (size_t k = 0; k < units.size(); ++k) {
      if (units[k].get() != item.value().get() || found[k]) continue;
      found[k] = true;
      units_.emplace_back(item.key());
      for (const auto& p : item.value()->parameters(true)) unit_of[p.unsafeGetTensorImpl()] = units_.size() - 1;
    }
  }
  if (std::find(found.begin(), found.end(), false) != found.end())
    throw InvalidArgument("ShardedDataParallel: a unit is not a submodule of the module");
  std::vector<size_t> out;
  for (const auto& p : module.parameters(true)) {
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    out.push_back(it == unit_of.end() ? 0 : it->second);
  }
  return out;
}

void ShardedState::add_param(const std::string& name, const at::Tensor& param, size_t unit) {
  if (!param.device().is_cpu())
    throw InvalidArgument(concat("ShardedDataParallel: parameter '", name, "' is on ", param.device().str(),
                                 "; this build shards parameters on the CPU"));
  at::Tensor values = param.is_sparse() || !param.is_contiguous() ? param.contiguous() : param;
  if (!joining_) ctx_.group->broadcast_(values, 0);  // rank 0's values win
  adopt(std::make_unique<ShardedParam>(name, param, values, unit, ctx_));
}

void ShardedState::adopt(std::unique_ptr<ShardedParam> param) {
  const size_t index = params_.size();
  params_.push_back(std::move(param));
  ShardedParam& p = *params_.back();
  p.storage = make_sharded(p.param, shared_from_this(), index);  // the full values go with the old storage
  units_[p.unit].params.push_back(&p);
  if (p.param.requires_grad()) units_[p.unit].reduced.push_back(&p);
}

bool ShardedState::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ != TrainingState::Idle || in_backward();
}

void ShardedState::touch(size_t i, const std::string& op) {
  std::lock_guard<std::mutex> lock(mu_);
  ShardedParam& p = *params_[i];
  const size_t u = p.unit;
  if (in_backward()) {
    enter_backward();
    if (!p.gathered()) {
      units_[u].gather(ctx_);
      // Backward runs units in the reverse of forward order: the one before this is next.
      auto at = std::find(forward_order_.begin(), forward_order_.end(), u);
      if (prefetch_ && at != forward_order_.end() && at != forward_order_.begin()) units_[*(at - 1)].prefetch(ctx_);
    }
    return;
  }
  if (state_ == TrainingState::Forward) {
    if (!seen_in_forward_[u]) {
      seen_in_forward_[u] = 1;
      forward_order_.push_back(u);
    }
    if (current_ != u) {
      if (reshards_after_forward() && current_ && *current_ != 0) units_[*current_].free(ctx_);
      current_ = u;
      units_[u].gather(ctx_);
      // The unit the previous forward used after this one travels while this one computes.
      auto at = std::find(last_order_.begin(), last_order_.end(), u);
      if (prefetch_ && at != last_order_.end() && at + 1 != last_order_.end()) units_[*(at + 1)].prefetch(ctx_);
    } else if (!p.gathered()) {
      units_[u].gather(ctx_);
    }
    return;
  }
  if (p.held) return;  // GatheredParameters gathered it
  throw InvalidArgument(
      concat("ShardedDataParallel: parameter '", p.name, "' is sharded over the group's ", ctx_.world,
             " ranks (this rank holds elements of it only), so ", op,
             " cannot use it here. Run the module inside forward: sdp.forward([&] { return model->forward(x); }); "
             "to read or change the full values outside it, use chorus::GatheredParameters; to save them, "
             "sdp.full_state_dict()"));
}

void ShardedState::begin_forward() {
  rethrow_deferred();
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == TrainingState::Forward)
    throw InvalidArgument("ShardedDataParallel::forward: already inside forward of this module");
  if (in_backward()) throw InvalidArgument("ShardedDataParallel::forward: called during a backward pass");
  if (state_ == TrainingState::Backward) abandon_backward();
  free_all();  // ShardGradOp's units of a forward whose backward never came
  state_ = TrainingState::Forward;
  forward_order_.clear();
  std::fill(seen_in_forward_.begin(), seen_in_forward_.end(), 0);
  current_.reset();
  if (prefetch_ && !last_order_.empty()) units_[last_order_.front()].prefetch(ctx_);
}

void ShardedState::end_forward(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = TrainingState::Idle;
  current_.reset();
  last_order_ = forward_order_;
  // Only a backward that will come needs ShardGradOp's units.
  if (!ok || !at::GradMode::is_enabled() || reshards_after_forward()) free_all();
  // The backward of this forward reduces units in the reverse order, then those it did not use.
  reduction_order_.assign(forward_order_.rbegin(), forward_order_.rend());
  for (size_t u = 0; u < units_.size(); ++u)
    if (!seen_in_forward_[u]) reduction_order_.push_back(u);
}

void ShardedState::check_idle(const char* what) {
  if (busy())
    throw InvalidArgument(
        concat(what, ": a sharded module is in its forward or backward; call it before forward or after backward"));
  check_not_held(what);
}

void ShardedState::check_not_held(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : params_)
    if (p->held)
      throw InvalidArgument(
          concat(what, ": parameter '", p->name, "' is held by a GatheredParameters; call it after that exits"));
}

void ShardedState::prepare_load() {
  check_idle("load_checkpoint");
  std::lock_guard<std::mutex> lock(mu_);
  free_all();
}

void ShardedState::free_all() {
  for (auto& u : units_) u.free(ctx_);
}

std::vector<at::Tensor> ShardedState::parameters() {
  std::vector<at::Tensor> out;
  for (const auto& p : params_) out.push_back(p->shard);
  return out;
}

torch::OrderedDict<std::string, at::Tensor> ShardedState::named_parameters() {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : params_) out.insert(p->name, p->shard);
  return out;
}

torch::OrderedDict<std::string, at::Tensor> ShardedState::full_state_dict(torch::nn::Module& module) {
  if (busy()) throw InvalidArgument("ShardedDataParallel::full_state_dict: called during forward or backward");
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : params_) {  // one parameter at a time onto rank 0
    std::optional<at::Tensor> stacked = ctx_.group->gather(p->shard.detach(), 0);
    if (!stacked) continue;
    at::Tensor full = stacked->reshape({-1}).narrow(0, 0, p->numel).reshape(p->param.sizes()).clone();
    out.insert(p->name, full);
    for (const auto& alias : p->aliases) out.insert(alias, full);  // as module.named_parameters() lists it
  }
  if (ctx_.rank == 0)
    for (const auto& item : module.named_buffers(true)) out.insert(item.key(), item.value().detach().clone());
  return out;
}

ShardedDataParallel::MemoryStats ShardedState::memory_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ShardedDataParallel::MemoryStats m;
  for (const auto& p : params_) {
    m.shard_bytes += bytes_of(p->shard);
    m.shard_grad_bytes += bytes_of(p->shard.grad());
    m.full_bytes += bytes_of(p->full());
    m.full_grad_bytes += bytes_of(p->param.grad());
  }
  m.peak_transient_bytes = std::max(ctx_.memory.peak, m.full_bytes + m.full_grad_bytes);
  m.cached_bytes = ctx_.buffers.bytes();
  return m;
}

void ShardedState::reset_peak_memory() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : params_) p->note_grad(ctx_);  // a .grad the user dropped is dropped from the ledger
  ctx_.memory.peak = ctx_.memory.full + ctx_.memory.full_grad;
}

std::vector<std::pair<std::string, std::vector<std::string>>> ShardedState::unit_layout() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& u : units_) {
    std::vector<std::string> names;
    for (const ShardedParam* p : u.params) names.push_back(p->name);
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
