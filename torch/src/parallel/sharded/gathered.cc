// Note [Gathered parameters]
// GatheredParameters sorts what it is given into entries: one per ShardedDataParallel whose
// sharded parameters are among them (parameters in that module's order, duplicates dropped,
// entries in the order the modules were made, the same on every rank), and one per DDP group for
// replicated parameters. Tensors of neither kind are left alone.
// Entering:
//   1. every rule that can be checked locally is checked (no overlap with a live
//      GatheredParameters, not during forward or backward, a modifier rank inside the group)
//      before any collective, so a rejected call leaves everything as it was;
//   2. per sharded entry, the ranks exchange what they are gathering (parameter names and the
//      modifier) with all_gather_v: a rank whose list differs gets CollectiveMismatch showing every
//      rank's list, and a rank that never comes is named by the group's TimeoutError;
//   3. the parameters are gathered and held (forward's freeing leaves them alone), with their
//      version counters noted.
// Exiting, per entry: with a modifier rank, its full values are broadcast and every rank re-slices
// its shard from them; without one, the ranks exchange which parameters changed in place (version
// counter, or this rank's own elements differing from its shard) and all raise InvalidArgument
// naming them and the ranks that changed them, with the shards as they were. DDP entries broadcast
// the modifier's values and do nothing else.
#include <algorithm>
#include <iostream>

#include "groups/agreement.h"
#include "groups/placement.h"
#include "groups/tensor_util.h"
#include "parallel/sharded/state.h"

namespace chorus {

namespace detail {
struct GatheredEntry {
  std::shared_ptr<ShardedState> state;     // sharded parameters...
  std::shared_ptr<ProcessGroup> replicas;  // ...or a DDP group's replicated ones
  std::vector<size_t> indices;             // sharded: parameter indices, ascending
  std::vector<at::Tensor> tensors;         // replicated
  std::optional<int> modifier;
  bool held = false;
};
}  // namespace detail

using detail::concat;
using detail::GatheredEntry;
using detail::ShardedState;

GatheredParameters::GatheredParameters(std::vector<at::Tensor> params, std::optional<int> modifier_rank, bool enabled) {
  if (enabled) enter(std::move(params), modifier_rank);
}

GatheredParameters::GatheredParameters(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                                       std::optional<int> modifier_rank, bool enabled) {
  if (!enabled) return;
  std::vector<at::Tensor> params;
  for (const auto& m : modules) {
    if (!m) throw InvalidArgument("GatheredParameters: a module is null");
    for (const auto& p : m->parameters(true)) params.push_back(p);
  }
  enter(std::move(params), modifier_rank);
}

namespace {

using Entries = std::vector<std::shared_ptr<GatheredEntry>>;

std::string describe_list(const std::vector<std::string>& names, std::optional<int> modifier) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += concat(i ? ", " : "", names[i]);
  return concat(s, "] modifier_rank=", modifier ? std::to_string(*modifier) : std::string("none"));
}

std::shared_ptr<GatheredEntry>& entry_for(Entries& entries, const detail::Placement& where) {
  auto it = std::find_if(entries.begin(), entries.end(), [&](const auto& e) {
    return where.owner ? e->state == where.owner : !e->state && e->replicas == where.group;
  });
  if (it != entries.end()) return *it;
  entries.push_back(std::make_shared<GatheredEntry>());
  entries.back()->state = sharded_state_of(where);
  if (!where.owner) entries.back()->replicas = where.group;
  return entries.back();
}

// One entry per sharded module (its indices sorted, once each) and per DDP group, in the modules'
// made-order: the same on every rank.
Entries sort_into_entries(const std::vector<at::Tensor>& params, std::optional<int> modifier_rank) {
  Entries entries;
  for (const at::Tensor& t : params) {
    const detail::Placement where = detail::placement_of(t);
    switch (where.kind) {
      case detail::Placement::Kind::Plain: break;
      case detail::Placement::Kind::Shard: entry_for(entries, where)->indices.push_back(where.index); break;
      case detail::Placement::Kind::Replica: {
        if (!modifier_rank) break;  // nothing to do for replicas without a modifier
        auto& tensors = entry_for(entries, where)->tensors;
        if (std::none_of(tensors.begin(), tensors.end(), [&](const at::Tensor& x) { return x.is_same(t); }))
          tensors.push_back(t);
        break;
      }
    }
  }
  for (auto& e : entries) {
    e->modifier = modifier_rank;
    std::sort(e->indices.begin(), e->indices.end());
    e->indices.erase(std::unique(e->indices.begin(), e->indices.end()), e->indices.end());
  }
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const uint64_t ia = a->state ? a->state->id() : UINT64_MAX, ib = b->state ? b->state->id() : UINT64_MAX;
    return ia < ib;
  });
  return entries;
}

// Step 1: every rule this rank can check alone.
void check_local_rules(const Entries& entries) {
  for (const auto& e : entries) {
    ProcessGroup& group = e->state ? e->state->group() : *e->replicas;
    if (e->modifier && (*e->modifier < 0 || *e->modifier >= group.size()))
      throw InvalidArgument(concat("GatheredParameters: modifier_rank ", *e->modifier, " is not a rank of group '",
                                   group.name(), "' (", group.size(), " ranks)"));
    if (!e->state) continue;
    if (e->state->busy())
      throw InvalidArgument(
          "GatheredParameters: entered during a ShardedDataParallel's forward or backward; "
          "enter it before forward or after backward");
    std::string overlap = e->state->hold_problem(e->indices);
    if (!overlap.empty())
      throw InvalidArgument(concat("GatheredParameters: ", overlap,
                                   " already gathered by a GatheredParameters that is still alive; nested "
                                   "GatheredParameters must not share parameters"));
  }
  for (const auto& e : entries)
    if (e->state) e->state->rethrow_deferred();
}

// Step 2: the ranks agree on what one sharded entry gathers.
void agree(const GatheredEntry& e) {
  std::vector<std::string> names;
  for (size_t i : e.indices) names.push_back(e.state->param(i).name);
  detail::require_same(e.state->group().communicator(), "GatheredParameters",
                       "every rank must enter with the same parameters and modifier_rank",
                       describe_list(names, e.modifier));
}

}  // namespace

void GatheredParameters::enter(std::vector<at::Tensor> params, std::optional<int> modifier_rank) {
  Entries entries = sort_into_entries(params, modifier_rank);
  check_local_rules(entries);
  // 2. Agreement, then 3. gather and hold. A failure gives back what this rank holds, without
  // communicating: the ranks are no longer in step.
  done_ = false;
  try {
    for (auto& e : entries) {
      if (e->state) agree(*e);
      entries_.push_back(e);
      if (!e->state) continue;
      e->state->hold(e->indices);
      e->held = true;
    }
  } catch (...) {
    for (auto& e : entries_)
      if (e->state) e->state->drop(e->indices);
    entries_.clear();
    done_ = true;
    throw;
  }
}

void GatheredParameters::exit() {
  if (done_) return;
  done_ = true;
  std::exception_ptr error;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {  // the reverse of entering
    GatheredEntry& e = **it;
    try {
      if (e.replicas) {
        if (e.modifier) {
          at::NoGradGuard no_grad;
          for (at::Tensor t : e.tensors) e.replicas->broadcast_(t, *e.modifier);
        }
        continue;
      }
      if (!e.held) continue;
      e.held = false;
      std::string edited = e.state->release(e.indices, e.modifier);
      if (!edited.empty())
        throw InvalidArgument(concat("GatheredParameters: ", edited,
                                     " changed in place without a modifier_rank, so the change was dropped; pass "
                                     "modifier_rank = the rank whose values should win"));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  entries_.clear();
  if (error) std::rethrow_exception(error);
}

GatheredParameters::~GatheredParameters() {
  if (done_) return;
  std::vector<std::shared_ptr<ShardedState>> states;
  for (auto& e : entries_)
    if (e->state) states.push_back(e->state);
  try {
    exit();
  } catch (const std::exception& err) {
    std::cerr << "chorus: " << err.what() << " (thrown again by the module's next forward or GatheredParameters)"
              << std::endl;
    for (auto& s : states) s->defer_error(std::current_exception());
  } catch (...) {
    for (auto& s : states) s->defer_error(std::current_exception());
  }
}

}  // namespace chorus

namespace chorus::detail {

std::string ShardedState::hold_problem(const std::vector<size_t>& indices) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string held;
  for (size_t i : indices)
    if (params_[i]->held) held += concat(held.empty() ? "" : ", ", "'", params_[i]->name, "'");
  return held.empty() ? "" : concat("parameter(s) ", held, " are");
}

void ShardedState::hold(const std::vector<size_t>& indices) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i : indices) {
    ShardedParam& p = *params_[i];
    p.held = true;  // first: a gather that fails is dropped with the rest
    p.gather(ctx_);
    p.version_at_hold = p.version();
  }
}

void ShardedState::drop(const std::vector<size_t>& indices) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i : indices) {
    params_[i]->held = false;
    params_[i]->free(ctx_);
  }
}

std::string ShardedState::release(const std::vector<size_t>& indices, std::optional<int> modifier_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  struct Unhold {  // however this ends (a peer gone mid-broadcast too), the full copies go
    ShardedState& s;
    const std::vector<size_t>& indices;
    ~Unhold() {
      for (size_t i : indices) {
        s.params_[i]->held = false;
        s.params_[i]->free(s.ctx_);
      }
    }
  } unhold{*this, indices};
  std::string edited;
  if (modifier_rank) {
    for (size_t i : indices) {
      ShardedParam& p = *params_[i];
      at::Tensor values = p.full().narrow(0, 0, p.numel);
      ctx_.group->broadcast_(values, *modifier_rank);
      if (p.mine.size() > 0)
        p.shard.detach().narrow(0, 0, p.mine.size()).copy_(values.narrow(0, p.mine.begin, p.mine.size()));
    }
  } else {
    at::Tensor changed = at::zeros({int64_t(indices.size())}, at::kByte);
    for (size_t k = 0; k < indices.size(); ++k) {
      const ShardedParam& p = *params_[indices[k]];
      const bool differs =
          p.mine.size() > 0 &&
          !p.full().narrow(0, p.mine.begin, p.mine.size()).equal(p.shard.detach().narrow(0, 0, p.mine.size()));
      changed.data_ptr<uint8_t>()[k] = p.version() != p.version_at_hold || differs;
    }
    at::Tensor all = ctx_.group->all_gather(changed);  // (W, k)
    for (size_t k = 0; k < indices.size(); ++k) {
      std::string ranks;
      for (int r = 0; r < ctx_.world; ++r)
        if (all[r][int64_t(k)].item<uint8_t>()) ranks += concat(ranks.empty() ? "" : ", ", r);
      if (!ranks.empty())
        edited +=
            concat(edited.empty() ? "" : ", ", "parameter '", params_[indices[k]]->name, "' (on rank ", ranks, ")");
    }
  }
  return edited;
}

}  // namespace chorus::detail
