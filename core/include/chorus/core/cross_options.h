// How the tcp backend moves data between hosts: the tuning a group is made with
// (CommunicatorOptions::cross), each unset field taken from its CHORUS_CROSS_* setting
// (settings.h). Note [Choosing an algorithm between hosts] (core/src/net/cost_model.h) is the rule
// these override.
#pragma once

#include <string>

namespace chorus {

struct CrossOptions {
  // The algorithm of each collective between hosts. Empty: the cost model picks by size and rank
  // count. One name for every collective that has it ("ring"), or per collective
  // ("all_reduce=halving_doubling,broadcast=binomial"). Names: recursive_doubling, ring,
  // halving_doubling, direct, binomial, scatter_ring, chain.
  std::string algorithm;
  // The network terms of the cost model. Empty: measured when the group is made. Otherwise
  // "alpha_us=30,gbps=10,fold_gbps=40,o_us=2", any subset.
  std::string cost;

  CrossOptions or_else(const CrossOptions& fallback) const {
    return {algorithm.empty() ? fallback.algorithm : algorithm, cost.empty() ? fallback.cost : cost};
  }
};

}  // namespace chorus
