// Note [Checkpoint layout]
// A checkpoint is a list of tensors, each named by a key (catalog.h's `keys`: "<item>/<parameter>"
// for modules, "<item>/state/<parameter ref>/<state name>" for optimizers, a parameter ref being
// "<module item>.<parameter name>"), with its full shape and dtype, plus the items' other values
// (optimizer options and steps, user values) in one dict written by rank 0.
// How the ranks hold a tensor decides who writes which part of it:
//   - Sharded (ShardedDataParallel's parameters and their optimizer state): rank r holds elements
//     [r*S, min(N, (r+1)*S)) of the flattened tensor and writes them;
//   - Split (a DDP module's parameters and their optimizer state: equal on every rank): rank r
//     writes the same kind of range with S = ceil(N/W), so every rank writes 1/W of the bytes;
//   - Replicated (plain modules, buffers, anything else): rank 0's values, written by rank 0.
// A reader asks for a range (its shard) or the whole tensor and gets it from whichever parts
// cover it, so a checkpoint written at W by one strategy loads at W' under another.
// Parameters are recognised by their tensors: a module whose parameters are sharded belongs to its
// ShardedDataParallel, one whose parameters a DDP holds is split, so passing a module or its
// wrapper is the same. An optimizer's parameters are named after the modules in the same state
// (a shard by its parameter's name); others by position ("<item>.group<g>.param<k>").
// How a module's tensor is held is placement_of's answer (placement.h).
#include "parallel/checkpoint/catalog.h"

#include <torch/optim.h>

#include <unordered_map>

#include "groups/placement.h"
#include "parallel/checkpoint/optimizers.h"
#include "parallel/sharded/state.h"

namespace chorus::detail::checkpoint {

namespace optim = torch::optim;
using Dict = c10::impl::GenericDict;

std::pair<int64_t, int64_t> part_of(const Slot& s, int rank, int world) {
  if (s.layout == Layout::Replicated) return rank == 0 ? std::make_pair(int64_t(0), s.numel) : std::make_pair(0L, 0L);
  const ShardRange r =
      shard_range(s.numel, s.layout == Layout::Sharded ? s.shard_numel : shard_numel(s.numel, world), rank);
  return {r.begin, r.end};
}

namespace {

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

std::string strategy_name(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard     ? "full_shard"
         : s == ShardingStrategy::ShardGradOp ? "shard_grad_op"
                                              : "no_shard";
}

// A module's tensor as its placement says (placement.h); `holder` becomes the tensor the
// optimizer holds for it, `kind` the module's kind.
Slot module_slot(const std::string& key, const at::Tensor& p, const c10::TensorImpl*& holder, std::string& kind,
                 Catalog& c, bool for_load, std::vector<std::shared_ptr<ShardedState>>& owners) {
  Slot s;
  s.key = key;
  s.dtype = p.scalar_type();
  s.shape = p.sizes().vec();
  s.numel = p.numel();
  holder = p.unsafeGetTensorImpl();
  switch (const Placement where = placement_of(p); where.kind) {
    case Placement::Kind::Shard: {
      const std::shared_ptr<ShardedState> engine = sharded_state_of(where);
      if (std::find(owners.begin(), owners.end(), engine) == owners.end()) {
        if (for_load) engine->prepare_load();
        owners.push_back(engine);
      }
      s.layout = Layout::Sharded;
      s.shard_numel = where.shard;
      s.local = where.local.detach();  // (p itself gathers on any operator)
      holder = where.local.unsafeGetTensorImpl();
      kind = strategy_name(engine->strategy());
      c.sharded = true;
      break;
    }
    case Placement::Kind::Replica:
      s.layout = Layout::Split;
      s.local = p.detach();
      kind = "ddp";
      break;
    case Placement::Kind::Plain: s.local = p.detach(); break;
  }
  return s;
}

// Adds the slots of one module item; records its parameters in `params`.
void add_module(Catalog& c, const std::string& item, torch::nn::Module& m, bool for_load, ParamInfos& params) {
  std::string kind = "plain";
  std::unordered_map<const c10::TensorImpl*, bool> seen;
  std::vector<std::shared_ptr<ShardedState>> owners;
  for (const auto& it : m.named_parameters(true)) {
    if (!seen.emplace(it.value().unsafeGetTensorImpl(), true).second) continue;  // tied: once, first name
    const c10::TensorImpl* holder = nullptr;
    Slot s = module_slot(keys::module_tensor(item, it.key()), it.value(), holder, kind, c, for_load, owners);
    params[holder] = ParamInfo{keys::param_ref(item, it.key()), s.layout, s.shard_numel, s.shape};
    c.slots.push_back(std::move(s));
  }
  for (const auto& it : m.named_buffers(true)) {
    Slot s;
    s.key = keys::module_tensor(item, it.key());
    s.dtype = it.value().scalar_type();
    s.shape = it.value().sizes().vec();
    s.numel = it.value().numel();
    s.local = it.value().detach();
    c.slots.push_back(std::move(s));
  }
  c.items.emplace_back(item, "module:" + kind);
}

// The optimizer's parameters as the checkpoint names them, group by group.
std::vector<std::vector<ParamInfo>> optimizer_params(optim::Optimizer& o, const std::string& item,
                                                     const ParamInfos& params) {
  std::vector<std::vector<ParamInfo>> out;
  for (size_t g = 0; g < o.param_groups().size(); ++g) {
    out.emplace_back();
    const auto& ps = o.param_groups()[g].params();
    for (size_t k = 0; k < ps.size(); ++k) {
      auto it = params.find(ps[k].unsafeGetTensorImpl());
      out.back().push_back(it != params.end() ? it->second : ParamInfo{keys::positional_ref(item, g, k)});
    }
  }
  return out;
}

// A slot for one optimizer state tensor of a parameter: laid out as the parameter is, shaped as the
// full parameter (a shard's state is shaped like the shard).
Slot state_slot(std::string key, const ParamInfo& info, at::ScalarType dtype, at::IntArrayRef own_shape) {
  Slot s;
  s.key = std::move(key);
  s.dtype = dtype;
  s.layout = info.layout;
  s.shard_numel = info.shard_numel;
  s.shape = info.shape ? *info.shape : own_shape.vec();
  s.numel = c10::multiply_integers(s.shape);
  return s;
}

// Adds the slots of one optimizer item and its object: options, steps and parameter names.
void add_optimizer(Catalog& c, const std::string& item, optim::Optimizer& o, const ParamInfos& params) {
  const Codec& codec = codec_of(o, item);
  const auto refs = optimizer_params(o, item, params);
  c10::impl::GenericList groups(c10::AnyType::get());
  Dict steps = new_dict();
  for (size_t g = 0; g < refs.size(); ++g) {
    Dict group = codec.options(o.param_groups()[g].options());
    c10::impl::GenericList names(c10::StringType::get());
    const auto& ps = o.param_groups()[g].params();
    for (size_t k = 0; k < ps.size(); ++k) {
      const ParamInfo& info = refs[g][k];
      names.push_back(info.ref);
      auto st = o.state().find(state_key(ps[k]));
      if (st == o.state().end()) continue;  // no step taken yet
      if (int64_t step = codec.step(*st->second); step >= 0) steps.insert(info.ref, step);
      for (auto& [tname, t] : codec.tensors(*st->second)) {
        if (!t.defined()) continue;
        Slot slot = state_slot(keys::optimizer_state_prefix(item, info.ref) + tname, info, t.scalar_type(), t.sizes());
        slot.local = t.detach();
        c.slots.push_back(std::move(slot));
      }
    }
    group.insert("params", names);
    groups.push_back(group);
  }
  Dict obj = new_dict();
  obj.insert("type", codec.type);
  obj.insert("param_groups", groups);
  obj.insert("steps", steps);
  c.objects.insert(item, obj);
  c.items.emplace_back(item, "optimizer:" + codec.type);
}

void check_item_names(const CheckpointState& state) {
  for (const auto& [name, item] : state)
    if (name.empty() || name.find('/') != std::string::npos)
      throw InvalidArgument(concat("CheckpointState: item name '", name, "' must be non-empty and without '/'"));
}

// Modules first: optimizers are named after their parameters.
template <class F>
void for_each_item(const CheckpointState& state, Stateful::Kind kind, F&& f) {
  for (const auto& [name, item] : state)
    if (item.kind() == kind) f(name, item);
}

}  // namespace

Catalog catalog_for_save(const CheckpointState& state) {
  check_item_names(state);
  Catalog c;
  ParamInfos params;
  for_each_item(state, Stateful::Kind::Module,
                [&](const std::string& name, const Stateful& s) { add_module(c, name, *s.module(), false, params); });
  for_each_item(state, Stateful::Kind::Optimizer,
                [&](const std::string& name, const Stateful& s) { add_optimizer(c, name, *s.optimizer(), params); });
  for_each_item(state, Stateful::Kind::Value, [&](const std::string& name, const Stateful& s) {
    c.objects.insert(name, s.get());
    c.items.emplace_back(name, "value");
  });
  return c;
}

struct LoadCatalog::OptimizerItem {
  std::string name;
  optim::Optimizer* optimizer;
  const Codec* codec;
  std::vector<std::vector<ParamInfo>> refs;
};

LoadCatalog::LoadCatalog(const CheckpointState& state, const std::map<std::string, at::ScalarType>& saved)
    : state_(state) {
  check_item_names(state);
  ParamInfos params;
  for_each_item(state, Stateful::Kind::Module, [&](const std::string& name, const Stateful& s) {
    add_module(catalog_, name, *s.module(), true, params);
  });
  for_each_item(state, Stateful::Kind::Optimizer, [&](const std::string& name, const Stateful& s) {
    add_optimizer(name, *s.optimizer(), params, saved);
  });
  for_each_item(state, Stateful::Kind::Value,
                [&](const std::string& name, const Stateful&) { catalog_.items.emplace_back(name, "value"); });
}

// Slots for the state tensors the checkpoint has for this optimizer's parameters (`saved`, by key):
// without a target, made by the loader and handed to finish(), except where the optimizer has a
// state tensor that fits already: that one is loaded in place.
void LoadCatalog::add_optimizer(const std::string& name, optim::Optimizer& o, const ParamInfos& params,
                                const std::map<std::string, at::ScalarType>& saved) {
  auto item = std::make_shared<OptimizerItem>();
  item->name = name;
  item->optimizer = &o;
  item->codec = &codec_of(o, name);
  item->refs = optimizer_params(o, name, params);
  for (size_t g = 0; g < item->refs.size(); ++g) {
    const auto& ps = o.param_groups()[g].params();
    for (size_t k = 0; k < ps.size(); ++k) {
      const ParamInfo& info = item->refs[g][k];
      const std::string prefix = keys::optimizer_state_prefix(name, info.ref);
      Tensors existing;
      if (auto st = o.state().find(state_key(ps[k])); st != o.state().end())
        existing = item->codec->tensors(*st->second);
      for (auto it = saved.lower_bound(prefix); it != saved.end() && it->first.rfind(prefix, 0) == 0; ++it) {
        Slot slot = state_slot(it->first, info, it->second, ps[k].sizes());
        const int64_t local = slot.layout == Layout::Sharded ? slot.shard_numel : slot.numel;
        for (const auto& [tname, t] : existing)
          if (tname == it->first.substr(prefix.size()) && t.defined() && t.scalar_type() == slot.dtype &&
              t.numel() == local && t.is_contiguous()) {
            slot.local = t.detach();
            in_place_[slot.key] = t;
          }
        catalog_.slots.push_back(std::move(slot));
      }
    }
  }
  catalog_.items.emplace_back(name, "optimizer:" + item->codec->type);
  optimizers_.push_back(std::move(item));
}

std::string LoadCatalog::problem(const c10::impl::GenericDict& objects) const {
  for (const auto& o : optimizers_) {
    if (!objects.contains(o->name)) return concat("has no optimizer '", o->name, "'");
    Dict obj = objects.at(o->name).toGenericDict();
    const std::string type = obj.at("type").toStringRef();
    if (type != o->codec->type)
      return concat("holds a ", type, " optimizer as '", o->name, "', this one is ", o->codec->type);
    auto groups = obj.at("param_groups").toList();
    std::string mine, theirs;
    for (size_t g = 0; g < o->refs.size(); ++g) {
      mine += concat(g ? "; " : "", "group ", g, ":");
      for (const auto& r : o->refs[g]) mine += " " + r.ref;
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      theirs += concat(g ? "; " : "", "group ", g, ":");
      for (const c10::IValue& r : groups.get(g).toGenericDict().at("params").toList().vec())
        theirs += " " + r.toStringRef();
    }
    if (mine != theirs)
      return concat("holds optimizer '", o->name, "' over other parameters (", theirs, "); this one has ", mine);
  }
  for (const auto& [name, item] : state_)
    if (item.kind() == Stateful::Kind::Value && !objects.contains(name)) return concat("has no value '", name, "'");
  return "";
}

void LoadCatalog::finish(const c10::impl::GenericDict& objects, std::map<std::string, at::Tensor>& loaded) {
  for (const auto& o : optimizers_) {
    Dict obj = objects.at(o->name).toGenericDict();
    auto groups = obj.at("param_groups").toList();
    Dict steps = obj.at("steps").toGenericDict();
    for (size_t g = 0; g < o->refs.size(); ++g) {
      optim::OptimizerParamGroup& group = o->optimizer->param_groups()[g];
      o->codec->set_options(group.options(), groups.get(g).toGenericDict());
      for (size_t k = 0; k < group.params().size(); ++k) {
        const std::string& ref = o->refs[g][k].ref;
        const std::string prefix = keys::optimizer_state_prefix(o->name, ref);
        std::map<std::string, at::Tensor> tensors;
        for (const auto* from : {&loaded, &in_place_})
          for (auto it = from->lower_bound(prefix); it != from->end() && it->first.rfind(prefix, 0) == 0; ++it)
            tensors[it->first.substr(prefix.size())] = it->second;
        void* const key = state_key(group.params()[k]);
        if (tensors.empty() && !steps.contains(ref)) {
          o->optimizer->state().erase(key);  // the checkpoint was taken before any step
          continue;
        }
        const int64_t step = steps.contains(ref) ? steps.at(ref).toInt() : 0;
        o->optimizer->state()[key] = o->codec->make(tensors, step);
      }
    }
  }
  for (const auto& [name, item] : state_)
    if (item.kind() == Stateful::Kind::Value) item.set(objects.at(name));
}

}  // namespace chorus::detail::checkpoint
