// Note [Hierarchy]: across hosts, "auto" runs all_reduce in three steps: a reduce-scatter inside
// each host (shm), an all-reduce of each slice between the ranks that hold the same slice on
// every host (the cross-host backend), and an all-gather inside each host (shm). Only 1/L of the
// data (L ranks per host) crosses the network per rank, and the shared-memory steps run at memory
// speed. It needs the same number of ranks on every host; otherwise, and for every other
// collective, the group runs flat on the cross-host backend. The whole group compares each call
// first (Call::compare_only), so a bad or mismatched call raises on every rank as it does on one
// host, and the step between hosts skips its own comparison (Call::compared).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "call.h"
#include "chorus/core/communicator.h"

namespace chorus {

// Below this many bytes an all_reduce is latency-bound, and one flat call beats three steps.
constexpr size_t kHierarchyMinBytes = 64 << 10;

class Hierarchy {
 public:
  // Collective over `group`, whose ranks live on `hosts` (each rank's host identity, more than
  // one distinct): splits off each host's ranks (shm) and each slice's ranks (`cross_backend`).
  // Null, and a line on rank 0's stderr saying why, when the hosts hold different numbers of ranks
  // or one rank each.
  static std::unique_ptr<Hierarchy> build(Communicator& group, const std::vector<std::string>& hosts,
                                          const std::string& cross_backend);

  // Whether this call goes the three steps: an all_reduce of at least kHierarchyMinBytes.
  bool serves(const Call& c) const {
    return c.kind == OpKind::AllReduce && c.invalid.empty() && c.count * element_size(c.dtype) >= kHierarchyMinBytes;
  }
  // Runs all_reduce `c` of the group in three steps (Note [Hierarchy]). Throws like a flat call;
  // a failure in a step is reported with the group's ranks, and aborts the group.
  void all_reduce(Call& c, Timeout timeout);
  // "hierarchical (shm in each host, gloo between hosts)"
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

  Communicator& group_;
  std::shared_ptr<Communicator> node_, cross_;  // this host's ranks; the ranks of this rank's slice
  std::vector<int> node_ranks_, cross_ranks_;   // their members, as ranks of the group
  std::vector<uint8_t> slice_;                  // this rank's slice, kept between calls
};

}  // namespace chorus
