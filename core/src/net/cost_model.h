// Note [Choosing an algorithm between hosts]: the one rule for which algorithm a collective of the
// "tcp" engine runs (net/algorithms.h). Each algorithm's time is predicted from the message size,
// the number of ranks P and four terms of the network (the Hockney model with a per-message
// overhead, as in Thakur, Rabenseifner and Gropp's study of MPICH's collectives):
//   alpha   seconds from one rank's send to its peer's receive of an empty message
//   beta    seconds per byte on a link
//   gamma   seconds per byte to fold (reduce) one buffer into another
//   o       seconds of a rank's own time per message it sends or receives (P-1 at once cost
//           (P-1) o; the direct algorithms pay it)
// and the smallest prediction wins. The terms are measured when the group is made (rank 0 and
// the first rank on another host ping-pong 8 B and 1 MiB; rank 0 times a fold; rank 0's numbers
// go to every rank, so all choose alike) unless CHORUS_CROSS_COST gives them, and
// CHORUS_CROSS_ALGORITHM overrides the choice (docs/settings.md). In a hierarchical group the L
// slices of a host cross at once over its link (Note [Hierarchy]), so each slice chooses with
// beta times L. The same functions drive the SimGrid model of bench/sim, whose predictions at up
// to 1,024 nodes check the rule.
//
// Measured terms vary from run to run, and so may a choice near a crossover. Only one choice can
// change a result's bits (Note [Algorithms between hosts]): the ring all_reduce against recursive
// doubling or halving-doubling, which on a power of two of ranks never wins (as many bytes, more
// steps), so it arises only on 3, 5, 6, 7... ranks between hosts, for float sums. A job that must
// give the same bits run after run there gives the terms (CHORUS_CROSS_COST) or the algorithm.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "call.h"
#include "net/algorithms.h"

namespace chorus::net {

struct NetCost {
  double alpha = 50e-6, beta = 1.0 / 1e9, gamma = 1.0 / 4e9, o = 2e-6;
};

// "alpha_us=30,gbps=10,fold_gbps=4,o_us=2" (any subset; the rest keep their defaults). Throws
// InvalidArgument naming what it cannot read.
NetCost parse_cost(const std::string& text);
std::string describe_cost(const NetCost& c);
// The terms as parse_cost reads them back (what a group passes to the groups it makes between
// hosts, so that they all choose alike).
std::string cost_setting(const NetCost& c);

// CrossOptions::algorithm as a map: "ring" -> {"*": "ring"}; "all_reduce=ring,..." per op. Throws
// InvalidArgument naming `what` (the setting) and the unknown op or algorithm.
std::map<std::string, std::string> parse_forced(const std::string& text, const std::string& what);

// The algorithms `op` can run (AllReduce, ReduceScatter, AllGather, Broadcast; others have one).
std::vector<Algorithm> candidates(OpKind op);
// Predicted seconds of `op` with `a` on p ranks; `bytes` is each rank's message (all_reduce's
// and broadcast's buffer, reduce_scatter's output block, all_gather's input block).
double predict(OpKind op, Algorithm a, size_t bytes, int p, const NetCost& c);
// How many segments a chain broadcast of `bytes` over p ranks cuts them into: the count that
// minimizes (P - 2 + S)(2 o + bytes / S beta), at least 16 KiB each (the chain pays each hop's
// alpha once: its segments stream, the next sent as the last arrives).
size_t chain_segments(size_t bytes, int p, const NetCost& c);
// The candidate with the smallest prediction, unless `forced` names one for this op ("ring" for
// every op that has it, or per op: {"all_reduce": "ring"}).
Algorithm choose(OpKind op, size_t bytes, int p, const NetCost& c, const std::map<std::string, std::string>& forced);

}  // namespace chorus::net
