// Note [Algorithms between hosts]: the "tcp" engine's collectives, written once against Links (a
// rank's view of its peers: exchanges that run together, copies and folds between its buffers)
// so that the same code moves real bytes (engine/tcp_engine.cc over net::Mesh) and simulated ones
// (bench/sim: SimGrid actors replaying each rank's exchanges at 1,024 nodes). Buffers are named,
// not pointed to: In, Out and a scratch Tmp, and spans are byte ranges of them.
//
// Every algorithm leaves bit-identical results on every rank that gets the result: each element
// of a reduction is either combined in one place and then copied (ring, halving-doubling), or
// combined pairwise with both partners computing a op b and b op a, which IEEE arithmetic makes
// equal (recursive doubling). Where it costs nothing, algorithms that do the same reduction add
// in the same order, so that the choice between them cannot change a float sum: halving-doubling
// pairs the ranks nearest first, as recursive doubling does, and both add in the same tree; a
// direct reduce_scatter folds the blocks in the ring's order (rank r + 1 first, r's own last).
// The ring all_reduce adds each chunk along the ring, which no tree can: between it and the other
// two (a choice only on a number of ranks that is not a power of two, Note [Choosing an algorithm
// between hosts]), a float sum may differ in its last bits. Integer sums, min, max and the
// bitwise ops never do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::net {

enum class Buf : uint8_t { In, Out, Tmp };
struct Span {
  Buf buf = Buf::Out;
  size_t offset = 0, bytes = 0;
};
// One message of an exchange. A receive with `fold` combines what arrives into `into`
// (into = from op received, `from` a span of into's size: into itself, or where this rank's own
// data still lies before the first fold) as it arrives; `span` is where it lands first.
struct Move {
  int peer = -1;
  bool send = false;
  Span span;
  bool fold = false;
  Span into, from;
};

class Links {
 public:
  virtual ~Links() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The moves progress together; returns when all are done. No two on one peer and direction.
  virtual void exchange(const std::vector<Move>& moves) = 0;
  // Copies between spans of equal size (nothing when they are the same memory).
  virtual void copy(Span from, Span to) = 0;
  // into = from op other, element-wise (`from` may be `into`).
  virtual void fold(Span into, Span from, Span other) = 0;
  void fold(Span into, Span other) { fold(into, into, other); }
  // Tmp holds at least `bytes` from now on (its contents are not kept).
  virtual void reserve_tmp(size_t bytes) = 0;
};

// The algorithms the engine can run; which one a call takes is net/cost_model.h's rule.
enum class Algorithm : uint8_t {
  RecursiveDoubling,  // all_reduce: log2 P exchanges of everything
  Ring,               // all_reduce, reduce_scatter, all_gather: P-1 steps (twice for all_reduce) of 1/P
  HalvingDoubling,    // all_reduce: recursive halving then doubling, log2 P steps each, 1/2 .. 1/P
  Direct,             // reduce_scatter, all_gather: every pair at once, one step
  Binomial,           // broadcast: a binomial tree from the root
  ScatterRing,        // broadcast: the root scatters P blocks, then a ring all_gather of them
  Chain,              // broadcast: segments flow down the chain root, root+1, ..., pipelined
};
const char* algorithm_name(Algorithm a);
// "ring" -> Ring, ...; false for an unknown name.
bool parse_algorithm(const std::string& name, Algorithm* out);

// In and Out may be the same memory for all_reduce and broadcast (count elements of elem bytes).
// all_reduce reads In where it first folds, so Out is written once and never copied from In.
void all_reduce(Links& l, size_t count, size_t elem, Algorithm a);
// In: P blocks of count elements; Out: this rank's block of their reduction.
void reduce_scatter(Links& l, size_t count, size_t elem, Algorithm a);
// In: this rank's block of `bytes`; Out: P blocks, rank order.
void all_gather(Links& l, size_t bytes, Algorithm a);
// Out on every rank; the root's Out holds the data at the start. Chain sends `segments` pieces.
void broadcast(Links& l, size_t bytes, int root, Algorithm a, size_t segments = 1);
// Out on root: the reduction of every rank's In (binomial tree).
void reduce(Links& l, size_t count, size_t elem, int root);
// Dissemination: ceil(log2 P) rounds of empty messages.
void barrier(Links& l);

}  // namespace chorus::net
