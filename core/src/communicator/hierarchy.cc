#include "communicator/hierarchy.h"

#include <algorithm>
#include <cstdio>

#include "call_compare.h"
#include "chorus/core/error.h"

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
  for (const auto& m : members)
    if (auto made = group.split_as(m, "shm", {})) h->node_ = made, h->node_ranks_ = m;
  for (size_t i = 0; i < per_host; ++i) {
    std::vector<int> same_slice;
    for (const auto& m : members) same_slice.push_back(m[i]);
    if (auto made = group.split_as(same_slice, cross_backend, {})) h->cross_ = made, h->cross_ranks_ = same_slice;
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

void Hierarchy::all_reduce(Call& c, Timeout timeout) {
  Call compare = c;
  compare.compare_only = true;
  group_.execute(compare, timeout);
  const auto deadline = Clock::now() + timeout.value_or(group_.timeout());
  auto left = [&] { return left_until(deadline); };
  // Each local rank's slice; the last count % L elements (fewer than L) go flat afterwards, so
  // that the steps read the input and write the output in place, without staging copies.
  const size_t es = element_size(c.dtype), L = size_t(node_->size());
  const size_t part = c.count / L, tail = c.count - part * L;
  slice_.resize(part * es);
  uint8_t* slice = slice_.data();
  step(c, *node_, node_ranks_, [&] { node_->reduce_scatter(c.in, slice, part, c.dtype, c.op, left()); });
  step(c, *cross_, cross_ranks_, [&] {  // compared above: skip the backend's own round
    Call across{.kind = OpKind::AllReduce, .dtype = c.dtype, .op = c.op, .count = part, .in = slice, .out = slice};
    across.compared = true;
    cross_->run(across, left());
  });
  step(c, *node_, node_ranks_, [&] { node_->all_gather(slice, c.out, part, c.dtype, left()); });
  if (tail) {
    Call rest = c;
    rest.count = tail;
    rest.in = static_cast<const uint8_t*>(c.in) + part * L * es;
    rest.out = static_cast<uint8_t*>(c.out) + part * L * es;
    group_.execute(rest, Timeout(left()));
  }
}

}  // namespace chorus
