// Note [Hierarchy]: across hosts, "auto" runs the collectives that move the most data in two or
// three steps: shared memory inside each host (shm), and between hosts only the ranks that hold
// the same slice, one rank per host (tcp, Note [Algorithms between hosts]). With L ranks on
// each of H hosts, rank i of every host is in slice i:
//   all_reduce      large: reduce-scatter in each host, all-reduce of each slice's 1/L between
//                   hosts, all-gather in each host (only 1/L of the data crosses per rank);
//                   small: all-reduce in each host, then every slice all-reduces the whole
//                   (identical inputs and one rule for all slices, so identical results)
//   broadcast       small: the root's slice between hosts, then each host from that rank;
//                   large: the root's host, then slice i carries the i-th part between hosts,
//                   then the other hosts gather the parts
//   all_gather      each slice gathers its ranks' blocks between hosts, each host gathers the
//                   slices, and the blocks are put in rank order
//   reduce_scatter  the blocks are put in slice order, each host reduce-scatters them (rank i
//                   gets its host's sum of slice i's blocks), each slice reduce-scatters that
//   barrier         each host, then every slice between hosts
// It needs the same number of ranks on every host; otherwise, and for every other collective,
// the group runs flat on the cross-host backend. The whole group compares each call first
// (Call::compare_only), so a bad or mismatched call raises on every rank as it does on one host,
// and the steps skip their own comparison (Call::compared). The slices take the group's measured
// network terms (CrossOptions::cost), so that every slice picks the same algorithm.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "call.h"
#include "chorus/core/communicator.h"

namespace chorus {

// Below this many bytes a collective is latency-bound, and the paths for small messages apply.
constexpr size_t kHierarchyMinBytes = 64 << 10;

class Hierarchy {
 public:
  // Collective over `group`, whose ranks live on `hosts` (each rank's host identity, more than
  // one distinct): splits off each host's ranks (shm) and each slice's ranks (`cross_backend`).
  // Null, and a line on rank 0's stderr saying why, when the hosts hold different numbers of ranks
  // or one rank each.
  static std::unique_ptr<Hierarchy> build(Communicator& group, const std::vector<std::string>& hosts,
                                          const std::string& cross_backend);

  // Whether this call goes by the steps: barrier, and all_reduce, broadcast, all_gather and
  // reduce_scatter of at least one element, with valid arguments.
  bool serves(const Call& c) const;
  // Runs `c` by the steps (Note [Hierarchy]). Throws like a flat call; a failure in a step is
  // reported with the group's ranks, and aborts the group.
  void run(Call& c, Timeout timeout);
  // "hierarchical (shm in each host, tcp between hosts)"
  std::string name() const;
  // The group failed: so do its subgroups, so that a rank blocked in a step is released.
  void fail(const std::exception_ptr& error) {
    for (auto* sub : {node_.get(), cross_.get()})
      if (sub) sub->fail(error);
  }

 private:
  Hierarchy(Communicator& group) : group_(group) {}
  template <class Step>
  void step(const Call& c, const Communicator& sub, const std::vector<int>& members, Step&& fn);
  void all_reduce(Call& c);
  void broadcast(Call& c);
  void all_gather(Call& c);
  void reduce_scatter(Call& c);
  // Steps on the host's ranks and on this rank's slice, with the errors of step().
  template <class Fn>
  void in_host(const Call& c, Fn&& fn) {
    step(c, *node_, node_ranks_, std::forward<Fn>(fn));
  }
  template <class Fn>
  void across(const Call& c, Fn&& fn) {
    step(c, *cross_, cross_ranks_, std::forward<Fn>(fn));
  }
  std::chrono::milliseconds left() const { return left_until(deadline_); }

  Communicator& group_;
  std::shared_ptr<Communicator> node_, cross_;  // this host's ranks; the ranks of this rank's slice
  std::vector<int> node_ranks_, cross_ranks_;   // their members, as ranks of the group
  std::vector<std::vector<int>> hosts_;         // each host's ranks; host_ and local_ place this rank
  int host_ = 0, local_ = 0;
  Clock::time_point deadline_;
  std::vector<uint8_t> slice_, staged_, gathered_;  // kept between calls
};

}  // namespace chorus
