#include "communicator/hierarchy.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "call_compare.h"
#include "chorus/core/error.h"
#include "net/cost_model.h"

namespace chorus {

std::unique_ptr<Hierarchy> Hierarchy::build(Communicator& group, const std::vector<std::string>& hosts,
                                            const std::string& cross_backend) {
  std::vector<std::string> distinct;
  std::vector<std::vector<int>> members;  // each host's ranks, in rank order
  for (int r = 0; r < group.size(); ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), hosts[size_t(r)]);
    if (it == distinct.end()) {
      distinct.push_back(hosts[size_t(r)]);
      members.emplace_back();
      it = distinct.end() - 1;
    }
    members[size_t(it - distinct.begin())].push_back(r);
  }
  const size_t per_host = members.front().size();
  const bool even = std::all_of(members.begin(), members.end(), [&](const auto& m) { return m.size() == per_host; });
  if (!even || per_host == 1) {
    if (group.rank() == 0)
      std::fprintf(stderr, "[chorus] group '%s': %d ranks on %zu hosts: %s (flat: %s)\n", group.name().c_str(),
                   group.size(), distinct.size(), cross_backend.c_str(),
                   even ? "one rank per host" : "hosts have different numbers of ranks");
    return nullptr;
  }
  std::unique_ptr<Hierarchy> h(new Hierarchy(group));
  for (size_t host = 0; host < members.size(); ++host)
    for (size_t i = 0; i < per_host; ++i)
      if (members[host][i] == group.rank()) h->host_ = int(host), h->local_ = int(i);
  h->hosts_ = members;
  for (const auto& m : members)
    if (auto made = group.split_as(m, "shm", {})) h->node_ = made, h->node_ranks_ = m;
  // The slices take the group's network terms (rank 0's measurement or the user's, Note
  // [Choosing an algorithm between hosts]), so that they all choose alike. A host's L slices
  // cross at once and share its link: each chooses with 1/L of the link's bandwidth.
  CrossOptions cross = group.options_.cross;
  if (cross.cost.empty() && group.store_->check({"tcp/cost"})) cross.cost = group.store_->get("tcp/cost");
  if (!cross.cost.empty()) {
    net::NetCost shared = net::parse_cost(cross.cost);
    shared.beta *= double(per_host);
    cross.cost = net::cost_setting(shared);
  }
  for (size_t i = 0; i < per_host; ++i) {
    std::vector<int> same_slice;
    for (const auto& m : members) same_slice.push_back(m[i]);
    if (auto made = group.split_as(same_slice, cross_backend, {}, cross))
      h->cross_ = made, h->cross_ranks_ = same_slice;
  }
  if (group.rank() == 0)
    std::fprintf(stderr, "[chorus] group '%s': %d ranks on %zu hosts: %s; other collectives on %s\n",
                 group.name().c_str(), group.size(), distinct.size(), h->name().c_str(), cross_backend.c_str());
  return h;
}

std::string Hierarchy::name() const {
  return detail::concat("hierarchical (", node_->backend_name(), " in each host, ", cross_->backend_name(),
                        " between hosts)");
}

// Runs one step on a subgroup; a failure there names ranks of the subgroup: say which ranks of
// the group they are, and abort the group.
template <class Step>
void Hierarchy::step(const Call& c, const Communicator& sub, const std::vector<int>& members, Step&& fn) {
  const std::string where =
      detail::concat(describe(c), " on group '", group_.name(), "', in its subgroup '", sub.name(), "': ");
  try {
    fn();
  } catch (const InvalidArgument&) {
    throw;
  } catch (const PeerFailure& e) {
    const int r = e.failed_rank() >= 0 ? members[size_t(e.failed_rank())] : -1;
    group_.fail(std::make_exception_ptr(PeerFailure(
        detail::concat(where, r >= 0 ? group_.describe_rank(r) : std::string("a peer"), " failed (", e.what(), ")"),
        r)));
  } catch (const TimeoutError& e) {
    std::vector<int> missing;
    for (int m : e.missing_ranks()) missing.push_back(members[size_t(m)]);
    group_.fail(std::make_exception_ptr(
        TimeoutError(detail::concat(where, "rank ", list_ranks(missing), " did not take part (", e.what(), ")"),
                     missing, e.operation())));
  } catch (const Error&) {
    group_.fail(std::current_exception());
  }
  std::lock_guard<std::mutex> lock(group_.state_mu_);
  if (group_.failed_) std::rethrow_exception(group_.failed_);
}

bool Hierarchy::serves(const Call& c) const {
  // An empty call moves nothing: flat, where no step copies from a null buffer.
  if (!c.invalid.empty() || (c.kind != OpKind::Barrier && c.count == 0)) return false;
  switch (c.kind) {
    case OpKind::Barrier:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::ReduceScatter: return true;
    case OpKind::AllGather: return c.outs.empty();
    default: return false;
  }
}

void Hierarchy::run(Call& c, Timeout timeout) {
  Call compare = c;
  compare.compare_only = true;
  group_.execute(compare, timeout);
  deadline_ = Clock::now() + timeout.value_or(group_.timeout());
  switch (c.kind) {
    case OpKind::AllReduce: return all_reduce(c);
    case OpKind::Broadcast: return broadcast(c);
    case OpKind::AllGather: return all_gather(c);
    case OpKind::ReduceScatter: return reduce_scatter(c);
    default:
      in_host(c, [&] { node_->barrier(left()); });
      across(c, [&] {
        Call between{.kind = OpKind::Barrier};
        between.compared = true;  // compared above: skip the backend's own round
        cross_->run(between, left());
      });
  }
}

void Hierarchy::all_reduce(Call& c) {
  const size_t es = element_size(c.dtype), L = size_t(node_->size());
  auto between = [&](const void* in, void* out, size_t count) {
    Call call{.kind = OpKind::AllReduce, .dtype = c.dtype, .op = c.op, .count = count, .in = in, .out = out};
    call.compared = true;
    cross_->run(call, left());
  };
  if (c.count * es < kHierarchyMinBytes || c.count < L) {
    in_host(c, [&] { node_->all_reduce(c.in, c.out, c.count, c.dtype, c.op, left()); });
    across(c, [&] { between(c.out, c.out, c.count); });
    return;
  }
  // Each local rank's slice; the last count % L elements (fewer than L) go flat afterwards, so
  // that the steps read the input and write the output in place, without staging copies.
  const size_t part = c.count / L, tail = c.count - part * L;
  slice_.resize(part * es);
  uint8_t* slice = slice_.data();
  in_host(c, [&] { node_->reduce_scatter(c.in, slice, part, c.dtype, c.op, left()); });
  across(c, [&] { between(slice, slice, part); });
  in_host(c, [&] { node_->all_gather(slice, c.out, part, c.dtype, left()); });
  if (tail) {
    Call rest = c;
    rest.count = tail;
    rest.in = static_cast<const uint8_t*>(c.in) + part * L * es;
    rest.out = static_cast<uint8_t*>(c.out) + part * L * es;
    group_.execute(rest, Timeout(left()));
  }
}

void Hierarchy::broadcast(Call& c) {
  const size_t es = element_size(c.dtype), L = size_t(node_->size());
  auto* buf = static_cast<uint8_t*>(c.out);
  const int root_host = [&] {
    for (size_t h = 0; h < hosts_.size(); ++h)
      if (std::find(hosts_[h].begin(), hosts_[h].end(), c.root) != hosts_[h].end()) return int(h);
    return 0;
  }();
  const int root_local = int(std::find(hosts_[size_t(root_host)].begin(), hosts_[size_t(root_host)].end(), c.root) -
                             hosts_[size_t(root_host)].begin());
  auto between = [&](uint8_t* at, size_t count) {
    Call call{.kind = OpKind::Broadcast, .dtype = c.dtype, .root = root_host, .count = count, .out = at};
    call.compared = true;
    cross_->run(call, left());
  };
  if (c.count * es < kHierarchyMinBytes || c.count < L) {  // the root's slice, then every host
    if (local_ == root_local) across(c, [&] { between(buf, c.count); });
    in_host(c, [&] { node_->broadcast(buf, c.count, c.dtype, root_local, left()); });
    return;
  }
  // The root's host has it all; slice i carries part i to the other hosts, which gather the parts.
  std::vector<size_t> counts(L);
  for (size_t i = 0; i < L; ++i) counts[i] = c.count * (i + 1) / L - c.count * i / L;
  const size_t mine = c.count * size_t(local_) / L;
  if (host_ == root_host) in_host(c, [&] { node_->broadcast(buf, c.count, c.dtype, root_local, left()); });
  across(c, [&] { between(buf + mine * es, counts[size_t(local_)]); });
  if (host_ == root_host) return;
  staged_.assign(buf + mine * es, buf + (mine + counts[size_t(local_)]) * es);
  in_host(c, [&] { node_->all_gather_v(staged_.data(), buf, counts, c.dtype, left()); });
}

void Hierarchy::all_gather(Call& c) {
  // Slice i carries block i of every host between the hosts, straight into place in the output;
  // then, host by host, the ranks of each host share what their slices brought, again into place.
  // Small: the slices' blocks go through one call in each host and are put in order after it.
  const size_t b = c.count * element_size(c.dtype), H = hosts_.size(), L = size_t(node_->size());
  auto* out = static_cast<uint8_t*>(c.out);
  auto place = [&](int rank) -> void* { return out + size_t(rank) * b; };
  std::vector<void*> slice;
  const bool small = b * H * L < kHierarchyMinBytes;
  if (small) gathered_.resize(H * b);
  for (size_t h = 0; h < H; ++h) slice.push_back(small ? gathered_.data() + h * b : place(hosts_[h][size_t(local_)]));
  across(c, [&] {
    Call call{.kind = OpKind::AllGather, .dtype = c.dtype, .count = c.count, .in = c.in};
    call.outs = slice;
    call.compared = true;
    cross_->run(call, left());
  });
  if (small) {
    staged_.resize(L * H * b);  // every slice's, slice by slice
    in_host(c, [&] { node_->all_gather(gathered_.data(), staged_.data(), H * c.count, c.dtype, left()); });
    for (size_t i = 0; i < L; ++i)
      for (size_t h = 0; h < H; ++h) std::memcpy(place(hosts_[h][i]), staged_.data() + (i * H + h) * b, b);
    return;
  }
  std::vector<void*> here(L);
  for (size_t h = 0; h < H; ++h) {
    for (size_t j = 0; j < L; ++j) here[j] = place(hosts_[h][j]);
    in_host(c, [&] { node_->all_gather_to(here[size_t(local_)], here, c.count, c.dtype, left()); });
  }
}

void Hierarchy::reduce_scatter(Call& c) {
  const size_t b = c.count * element_size(c.dtype), H = hosts_.size(), L = size_t(node_->size());
  const auto* in = static_cast<const uint8_t*>(c.in);
  staged_.resize(L * H * b);  // the blocks in slice order: slice i's blocks, host by host
  for (size_t i = 0; i < L; ++i)
    for (size_t h = 0; h < H; ++h) std::memcpy(staged_.data() + (i * H + h) * b, in + size_t(hosts_[h][i]) * b, b);
  gathered_.resize(H * b);  // this host's sum of this rank's slice's blocks
  in_host(c, [&] { node_->reduce_scatter(staged_.data(), gathered_.data(), H * c.count, c.dtype, c.op, left()); });
  across(c, [&] {
    Call call{.kind = OpKind::ReduceScatter,
              .dtype = c.dtype,
              .op = c.op,
              .count = c.count,
              .in = gathered_.data(),
              .out = c.out};
    call.compared = true;
    cross_->run(call, left());
  });
}

}  // namespace chorus
