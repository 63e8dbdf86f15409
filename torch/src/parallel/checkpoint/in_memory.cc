// Note [Commits in memory]
// elastic::State's commits (Note [Elastic in process]) are checkpoints kept in the processes'
// memory instead of files. They use the files' catalog (Note [Checkpoint layout]), so a commit made
// at W ranks under one strategy restores at W' under another, as a file does.
//   - Each rank copies what it holds: the whole of every tensor that is not sharded (replicas,
//     buffers, plain modules) and its real elements of every sharded one (its shards and their
//     optimizer state), plus the items' other values.
//   - Shards are also kept by a partner on another node. The ranks are listed node by node, and
//     each gives its shards to the rank L places later in that list, L being the most ranks any
//     node has: when no node has more than half of the ranks, every partner is on another node,
//     so losing any one node loses no shard.
//   - A commit is an exchange (one all_to_all of each rank's shards to its partner) and then a
//     barrier. After the barrier every rank has its partner's copy, so only then is the previous
//     commit dropped: at most two are held, and a failure during a commit leaves one complete.
//     Without shards there is nothing to exchange: every rank's copy is complete on its own.
//   - Restore is collective over the new group, survivors and newcomers alike. The ranks tell each
//     other which commits they hold and take the newest that they hold completely (a whole copy,
//     and each old rank's shards by itself or its partner). For each tensor, every new rank knows
//     which elements each rank needs (its new shard, or all of it) and who supplies each old
//     part (the lowest new rank holding it, its own copy first); one all_to_all per tensor moves
//     exactly those elements. The catalog's loader then makes the optimizer state and sets the
//     values, as a load from files does. Commits newer than the one taken are dropped.
// Memory, per rank: one copy of the replicated state, and two of the rank's shards (its own and
// its partner's); from a commit's start to its barrier, twice that.
#include "parallel/checkpoint/in_memory.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "chorus/core/error.h"
#include "groups/agreement.h"
#include "groups/placement.h"
#include "groups/tensor_util.h"
#include "parallel/checkpoint/catalog.h"
#include "parallel/objects/collective.h"

namespace chorus::detail::checkpoint {

namespace {

using List = c10::impl::GenericList;
using Dict = c10::impl::GenericDict;

// A record of a few fields (a list: torch's inline tuples confuse g++'s bounds warnings).
c10::IValue record(std::initializer_list<c10::IValue> fields) {
  List out(c10::AnyType::get());
  for (const auto& f : fields) out.push_back(f);
  return out;
}

// The tensors' descriptions, without values.
c10::IValue slots_value(const std::vector<Slot>& slots) {
  List out(c10::AnyType::get());
  for (const Slot& s : slots)
    out.push_back(
        record({s.key, int64_t(s.dtype), c10::List<int64_t>(s.shape), s.numel, int64_t(s.layout), s.shard_numel}));
  return out;
}

std::vector<Slot> slots_of(const c10::IValue& v) {
  std::vector<Slot> out;
  for (const c10::IValue& e : v.toList().vec()) {
    const std::vector<c10::IValue> t = e.toList().vec();
    Slot s;
    s.key = t[0].toStringRef();
    s.dtype = at::ScalarType(t[1].toInt());
    s.shape = t[2].toIntVector();
    s.numel = t[3].toInt();
    s.layout = Layout(t[4].toInt());
    s.shard_numel = t[5].toInt();
    out.push_back(std::move(s));
  }
  return out;
}

// Ranks listed node by node (nodes in the order of their first rank); each rank's partner is L
// places later, L the most ranks a node has. `to`: whom this rank gives its shards; `from`: whose
// it keeps. Collective (the ranks' nodes).
struct Partners {
  int to = 0, from = 0;
  bool crowded = false;  // a node has more than half of the ranks: some partners share a node
};

Partners partners(ProcessGroup& g) {
  const std::vector<std::string> nodes = all_gather_strings(g.communicator(), std::to_string(environment().node_rank));
  std::vector<std::string> node_order;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < g.size(); ++r) {
    auto& ranks = ranks_of[nodes[size_t(r)]];
    if (ranks.empty()) node_order.push_back(nodes[size_t(r)]);
    ranks.push_back(r);
  }
  std::vector<int> order;
  size_t most = 0;
  for (const auto& n : node_order) {
    order.insert(order.end(), ranks_of[n].begin(), ranks_of[n].end());
    most = std::max(most, ranks_of[n].size());
  }
  const size_t w = order.size(), at = size_t(std::find(order.begin(), order.end(), g.rank()) - order.begin());
  Partners p;
  p.to = order[(at + most) % w];
  p.from = order[(at + w - most % w) % w];
  p.crowded = 2 * most > w;
  return p;
}

}  // namespace

// One commit as this rank holds it.
struct MemoryCommits::Version {
  int64_t version = 0;
  int world = 0;
  bool sharded = false;  // some slot is sharded (then each old rank's parts must be found)
  std::vector<Slot> slots;
  c10::IValue objects;
  int own_rank = -1;                // the old rank whose parts `own` are (this rank, then)
  std::vector<at::Tensor> own;      // per slot: its real elements (sharded) or the whole tensor, flat
  int partner_rank = -1;            // whose shards `partner` holds; -1: none
  std::vector<at::Tensor> partner;  // per slot: that rank's real elements (sharded slots only)
};

MemoryCommits::MemoryCommits() = default;
MemoryCommits::~MemoryCommits() = default;

namespace {

using Version = MemoryCommits::Version;

// This rank's copy of `state` as it is now, as rank group.rank() of group.size().
Version snapshot(const CheckpointState& state, ProcessGroup& group, int64_t version) {
  Catalog c = catalog_for_save(state);
  Version v;
  v.version = version;
  v.world = group.size();
  v.own_rank = group.rank();
  v.objects = c10::IValue(c.objects).deepcopy();
  at::NoGradGuard no_grad;
  for (Slot& s : c.slots) {
    at::Tensor flat = s.local.detach().reshape({-1});
    if (s.layout == Layout::Sharded) {
      const auto [b, e] = part_of(s, group.rank(), group.size());
      v.own.push_back(flat.narrow(0, 0, e - b).clone());
      v.sharded = true;
    } else {
      v.own.push_back(flat.clone(at::MemoryFormat::Contiguous));
    }
    s.local = at::Tensor();
    v.slots.push_back(std::move(s));
  }
  return v;
}

// Gives this rank's shards of v to its partner and keeps the shards of the rank whose partner it
// is. Collective.
void exchange(Version& v, ProcessGroup& group) {
  const Partners p = partners(group);
  if (p.to == group.rank()) return;  // one node: nobody else to keep them
  static bool warned = false;
  if (p.crowded && !warned && group.rank() == 0) {
    warned = true;
    std::fprintf(stderr,
                 "[chorus] elastic: a node holds more than half of the %d ranks, so some ranks' shards are kept "
                 "twice on the same node: losing that node loses them\n",
                 group.size());
  }
  std::vector<at::Tensor> inputs(size_t(group.size())), outputs(size_t(group.size()));
  for (auto& t : inputs) t = at::empty({0}, at::kByte);
  for (auto& t : outputs) t = at::empty({0}, at::kByte);
  std::vector<at::Tensor> mine;
  int64_t theirs = 0;
  for (size_t i = 0; i < v.slots.size(); ++i) {
    if (v.slots[i].layout != Layout::Sharded) continue;
    mine.push_back(v.own[i].view(at::kByte));
    const auto [b, e] = part_of(v.slots[i], p.from, v.world);
    theirs += (e - b) * int64_t(c10::elementSize(v.slots[i].dtype));
  }
  inputs[size_t(p.to)] = at::cat(mine);
  outputs[size_t(p.from)] = at::empty({theirs}, at::kByte);
  group.all_to_all(outputs, inputs);
  const at::Tensor got = outputs[size_t(p.from)];
  v.partner.assign(v.slots.size(), at::Tensor());
  int64_t at = 0;
  for (size_t i = 0; i < v.slots.size(); ++i) {
    if (v.slots[i].layout != Layout::Sharded) continue;
    const auto [b, e] = part_of(v.slots[i], p.from, v.world);
    const int64_t n = (e - b) * int64_t(c10::elementSize(v.slots[i].dtype));
    v.partner[i] = got.narrow(0, at, n).view(v.slots[i].dtype);
    at += n;
  }
  v.partner_rank = p.from;
}

// Who holds what of which commit, as every rank tells it.
struct Holding {
  int64_t version = 0;
  int world = 0;
  bool sharded = false;
  int holder = 0;    // the new rank
  int old_rank = 0;  // whose parts
  bool own = false;  // its own copy (with the whole tensors) or a partner's shards
};

c10::IValue holdings_value(const std::vector<Version>& versions) {
  List out(c10::AnyType::get());
  for (const Version& v : versions) {
    out.push_back(record({v.version, int64_t(v.world), v.sharded, int64_t(v.own_rank), true}));
    if (v.partner_rank >= 0)
      out.push_back(record({v.version, int64_t(v.world), v.sharded, int64_t(v.partner_rank), false}));
  }
  return out;
}

// The choice every rank makes alike from everyone's holdings: the newest complete commit and who
// supplies each of its parts.
struct Plan {
  int64_t version = 0;
  int world = 0;
  int whole = -1;              // the new rank that supplies the whole tensors (and the values)
  std::vector<int> supplier;   // per old rank: who supplies its shards
  std::vector<bool> from_own;  // ... from its own copy (else a partner's)
};

Plan choose(const std::vector<Holding>& all) {
  std::set<int64_t, std::greater<>> versions;
  for (const Holding& h : all) versions.insert(h.version);
  std::string missing;
  for (int64_t version : versions) {
    Plan p;
    p.version = version;
    bool sharded = false;
    for (const Holding& h : all) {
      if (h.version != version) continue;
      p.world = h.world;
      sharded = sharded || h.sharded;
      if (h.own && (p.whole < 0 || h.holder < p.whole)) p.whole = h.holder;
    }
    p.supplier.assign(size_t(p.world), -1);
    p.from_own.assign(size_t(p.world), false);
    for (const Holding& h : all) {  // own copies first, then the lowest holder
      if (h.version != version || h.old_rank >= p.world) continue;
      int& s = p.supplier[size_t(h.old_rank)];
      const bool better = s < 0 || (h.own && !p.from_own[size_t(h.old_rank)]) ||
                          (h.own == p.from_own[size_t(h.old_rank)] && h.holder < s);
      if (better) s = h.holder, p.from_own[size_t(h.old_rank)] = h.own;
    }
    std::string lacking;
    if (sharded)
      for (int j = 0; j < p.world; ++j)
        if (p.supplier[size_t(j)] < 0) lacking += concat(lacking.empty() ? "" : ", ", j);
    if (p.whole >= 0 && lacking.empty()) return p;
    if (missing.empty())
      missing = concat("the newest, commit ", version, " of ", p.world, " ranks, lacks ",
                       lacking.empty() ? std::string("a whole copy") : "the shards of its rank(s) " + lacking);
  }
  throw Error(concat("elastic: no commit in memory can be put back: ", missing,
                     ". Each rank's shards were kept by itself and by one rank on another node, and both are gone "
                     "(two nodes lost at once?). Load the last checkpoint on disk instead."));
}

// Elements [b, e) of a flat tensor, as a 1-D tensor (empty when e <= b).
at::Tensor range(const at::Tensor& flat, int64_t part_begin, int64_t b, int64_t e) {
  return e > b ? flat.narrow(0, b - part_begin, e - b) : flat.narrow(0, 0, 0);
}

// Moves commit slot `cs` into load slot `ls` (need: its shard, or all of it, on each new rank).
// Returns the tensor filled (ls.local, or a new one when the loader makes it).
at::Tensor move_slot(const Slot& cs, const Slot& ls, const Plan& plan, const Version* mine, size_t index,
                     ProcessGroup& group) {
  struct Piece {
    int64_t begin, end;
    int supplier;
    int old_rank;  // -1: the whole tensor
  };
  std::vector<Piece> pieces;
  if (cs.layout == Layout::Sharded) {
    for (int j = 0; j < plan.world; ++j) {
      const ShardRange r = shard_range(cs.numel, cs.shard_numel, j);
      if (r.size() > 0) pieces.push_back({r.begin, r.end, plan.supplier[size_t(j)], j});
    }
  } else {
    pieces.push_back({0, cs.numel, plan.whole, -1});
  }
  const int w = group.size(), me = group.rank();
  auto need = [&](int t) {
    return ls.layout == Layout::Sharded ? part_of(ls, t, w) : std::make_pair(int64_t(0), ls.numel);
  };
  auto held = [&](const Piece& p) -> const at::Tensor& {
    if (p.old_rank < 0 || p.old_rank == mine->own_rank) return mine->own[index];
    return mine->partner[index];
  };
  const auto opts = at::TensorOptions().dtype(cs.dtype);
  std::vector<at::Tensor> inputs(static_cast<size_t>(w)), outputs(static_cast<size_t>(w));
  const auto [a, z] = need(me);
  for (int t = 0; t < w; ++t) {
    const auto [ta, tz] = need(t);
    std::vector<at::Tensor> parts;
    int64_t incoming = 0;
    for (const Piece& p : pieces) {
      if (p.supplier == me) {
        at::Tensor part = range(held(p), p.begin, std::max(p.begin, ta), std::min(p.end, tz));
        if (part.numel() > 0) parts.push_back(part);
      }
      if (p.supplier == t) incoming += std::max<int64_t>(0, std::min(p.end, z) - std::max(p.begin, a));
    }
    inputs[size_t(t)] = parts.empty() ? at::empty({0}, opts) : at::cat(parts);
    outputs[size_t(t)] = at::empty({incoming}, opts);
  }
  group.all_to_all(outputs, inputs);
  at::Tensor dst = ls.local.defined()             ? ls.local
                   : ls.layout == Layout::Sharded ? at::zeros({ls.shard_numel}, opts)
                                                  : at::empty(ls.shape, opts);
  at::Tensor buf = dst.is_contiguous() ? dst : at::empty(dst.sizes(), dst.options());
  at::Tensor flat = buf.reshape({-1});
  std::vector<int64_t> taken(static_cast<size_t>(w), 0);
  for (const Piece& p : pieces) {
    const int64_t b = std::max(p.begin, a), e = std::min(p.end, z);
    if (e <= b) continue;
    flat.narrow(0, b - a, e - b).copy_(outputs[size_t(p.supplier)].narrow(0, taken[size_t(p.supplier)], e - b));
    taken[size_t(p.supplier)] += e - b;
  }
  if (!buf.is_same(dst)) dst.copy_(buf);
  return dst;
}

}  // namespace

void MemoryCommits::commit(const CheckpointState& state, ProcessGroup& group, int64_t version) {
  versions_.push_back(snapshot(state, group, version));  // held from now on: the exchange may fail
  Version& v = versions_.back();
  if (v.sharded && group.size() > 1) {
    exchange(v, group);
    group.barrier();  // every rank holds its partner's copy: this commit is complete everywhere
  }
  versions_.erase(versions_.begin(), versions_.end() - 1);
}

int64_t MemoryCommits::restore(const CheckpointState& state, ProcessGroup& group) {
  const auto told = gather_values(
      group, -1, [&] { return holdings_value(versions_); }, "elastic: restoring the last commit");
  std::vector<Holding> all;
  for (int r = 0; r < group.size(); ++r)
    for (const c10::IValue& e : (*told)[size_t(r)].toList().vec()) {
      const std::vector<c10::IValue> t = e.toList().vec();
      all.push_back({t[0].toInt(), int(t[1].toInt()), t[2].toBool(), r, int(t[3].toInt()), t[4].toBool()});
    }
  // No rank holds a commit (a new job): rank 0's state becomes everyone's, each rank keeping its
  // own shards, through the same path as a commit.
  std::vector<Version> fresh;
  if (all.empty()) {
    fresh.push_back(snapshot(state, group, 0));
    for (int r = 0; r < group.size(); ++r) all.push_back({0, group.size(), fresh[0].sharded, r, r, true});
  }
  const std::vector<Version>& versions = fresh.empty() ? versions_ : fresh;
  const Plan plan = choose(all);
  const Version* mine = nullptr;
  for (const Version& v : versions)
    if (v.version == plan.version) mine = &v;

  const c10::IValue meta = broadcast_value(
      group, plan.whole,
      [&] {
        Dict d(c10::StringType::get(), c10::AnyType::get());
        d.insert("slots", slots_value(mine->slots));
        d.insert("objects", mine->objects.deepcopy());
        return c10::IValue(d);
      },
      "elastic: restoring the last commit");
  const std::vector<Slot> saved = slots_of(meta.toGenericDict().at("slots"));
  const Dict objects = meta.toGenericDict().at("objects").toGenericDict();
  std::map<std::string, size_t> index;
  std::map<std::string, at::ScalarType> dtypes;
  for (size_t i = 0; i < saved.size(); ++i) index[saved[i].key] = i, dtypes[saved[i].key] = saved[i].dtype;
  std::unique_ptr<LoadCatalog> lc;
  fail_together(group.communicator(), [&] {
    lc = std::make_unique<LoadCatalog>(state, dtypes);
    for (const Slot& s : lc->catalog().slots) {
      auto it = index.find(s.key);
      if (it == index.end())
        throw InvalidArgument(concat("elastic: the commit has no '", s.key, "': was the state changed since?"));
      const Slot& c = saved[it->second];
      if (c.shape != s.shape || (s.local.defined() && c.dtype != s.dtype))
        throw InvalidArgument(concat("elastic: '", s.key, "' is ", c10::toString(c.dtype), shape_string(c.shape),
                                     " in the commit but ", c10::toString(s.dtype), shape_string(s.shape), " now"));
    }
    if (std::string p = lc->problem(objects); !p.empty()) throw InvalidArgument(concat("elastic: the commit ", p));
  });
  std::map<std::string, at::Tensor> loaded;
  at::NoGradGuard no_grad;
  for (const Slot& s : lc->catalog().slots) {
    const size_t i = index.at(s.key);
    at::Tensor t = move_slot(saved[i], s, plan, mine, i, group);
    if (!s.local.defined()) loaded[s.key] = t;
  }
  lc->finish(objects, loaded);
  versions_.erase(
      std::remove_if(versions_.begin(), versions_.end(), [&](const Version& v) { return v.version > plan.version; }),
      versions_.end());
  return plan.version;
}

int64_t MemoryCommits::bytes() const {
  int64_t n = 0;
  for (const Version& v : versions_)
    for (const auto* ts : {&v.own, &v.partner})
      for (const at::Tensor& t : *ts)
        if (t.defined()) n += t.numel() * int64_t(t.element_size());
  return n;
}

}  // namespace chorus::detail::checkpoint
