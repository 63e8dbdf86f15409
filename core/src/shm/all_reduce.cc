// All-reduce and reduce.
//
// Tiny messages (<= kInlineBytes) ride in the call line: one phase, then every rank folds all
// inputs in rank order 0..W-1. Small messages (W x bytes <= kOneShotTotalBytes) do the same through the slots
// (one-shot). Larger ones are two-shot and pipelined: the message goes in rounds; in each round
// every rank owns 1/W of the round's elements, receives the other ranks' copies of its part,
// folds them in rank order, and publishes the folded part, which everyone else copies out (the
// folding rank writes it to its own output in the same pass). A phase carries both the inputs of
// round k and the folded parts of round k-1, so a round costs one phase. Every element is
// folded by exactly one rank in a fixed order, and the inline/one-shot paths fold in that same
// order on every rank, so all ranks end with identical bits. How a message of 16 KiB and more is
// stored into the slots, normally or streaming, rank 0 chooses by measuring (Note [Streaming into
// the slots]). With more ranks than cores an all_reduce of 1 MiB and more goes as a ring through
// the slots instead of two-shot (Note [Ring through the slots]).
//
// Note [Direct all_reduce]: when every rank's input and output lie in symmetric memory (Note
// [Symmetric buffers]), nothing is staged: rank r reads its part of every rank's input, folds
// it in rank order, and writes the result into every rank's output. Parts are disjoint, so one
// phase before (every input is ready) and one after (every output is written) are all the
// synchronization there is, in place or not. Each input byte is read once and each output byte
// written once (through a piece that stays in cache).

#include "reduce/reduce_kernels.h"
#include "shm/algorithms.h"
#include "shm/copy.h"

namespace chorus::shm {

namespace {
// One-shot makes every rank fold all W inputs: W times the work of two-shot's share. Worth it
// while the total stays small, which with more ranks means smaller messages.
constexpr size_t kOneShotTotalBytes = 256 * 1024;
// A round of the staged path fills every rank's slot at most this much in all (W x the round), so
// that the group's slots of two rounds stay in cache: with more ranks than cores a slot is deep
// (Note [Deep slots when ranks share cores]), and W=8 on 2 cores, 64 MiB, took 57-60 ms in
// rounds of 2 MiB a rank, 46-54 in rounds of 1 MiB, 46-48 in rounds of 512 KiB.
constexpr size_t kGroupRoundBytes = 8 << 20;
// The direct path folds this much at a time into a buffer that stays in cache, then copies the
// piece to every rank's output.
constexpr size_t kDirectPieceBytes = 64 * 1024;

// The rounds of a pipelined all_reduce (two-shot or ring): each of W parts of `fit` elements at
// most, rounded down to whole cache lines where one fits, so that no store splits a line; the last
// round is shorter. Part q of round k begins at begin(k, q).
struct RoundParts {
  RoundParts(size_t count, size_t fit, size_t es, int world) : count(count), world(world) {
    const size_t line = kLine / es;
    per_round = (fit >= line ? fit / line * line : fit) * size_t(world);
  }
  size_t begin(size_t k, int q) const {
    return k * per_round + in_round(count, per_round, k) * size_t(q) / size_t(world);
  }
  size_t rounds() const { return rounds_for(count, per_round); }
  size_t count;
  int world;
  size_t per_round = 0;
};

// Note [Direct all_reduce] (Note [Direct collectives]); false sends every rank down the staged path.
// `streams`: the call's copies into user buffers may stream (all_reduce(), Note [Streaming stores]).
bool all_reduce_direct(ShmGroup& g, const Call& c, bool streams) {
  const int world = g.world(), me = g.rank();
  const size_t es = element_size(c.dtype);
  const size_t bytes = c.count * es;
  DirectBuffers d;
  if (!d.exchange(g, c.in, c.out, bytes, bytes, {DirectBuffers::kIn, DirectBuffers::kOut})) return false;
  const size_t line = 64 / es;
  auto part_begin = [&](int q) { return q == world ? c.count : c.count * size_t(q) / size_t(world) / line * line; };
  const size_t b = part_begin(me), e = part_begin(me + 1);
  const size_t piece = kDirectPieceBytes / es;
  // Rank q's output is its input when both lie at one place of one allocation: then this rank
  // has just read the lines it writes there (Note [Streaming stores]).
  auto streams_to = [&](int q) { return streams && !d.in_place(q); };
  auto& srcs = source_list(world);
  std::vector<uint8_t*> outs(static_cast<size_t>(world));
  thread_local std::vector<uint8_t> folded(kDirectPieceBytes);
  for (size_t x = b; x < e; x += piece) {
    const size_t m = std::min(piece, e - x);
    for (int p = 0; p < world; ++p) {
      srcs[size_t(p)] = d.at(p, DirectBuffers::kIn) + x * es;
      outs[size_t(p)] = d.at(p, DirectBuffers::kOut) + x * es;
    }
    reduce::reduce(c.dtype, c.op, srcs.data(), world, folded.data(), m);
    for (int q = 0; q < world; ++q) copy_out(outs[size_t(q)], folded.data(), m * es, streams_to(q));
  }
  g.sync();  // every output is written
  return true;
}

// Note [Ring through the slots]: with more ranks than cores, the staged path's copies cost more
// than its waits. Each rank copies its input through its slot and folds its part from all W
// slots, so a round's W slots (of two rounds: 2 x kGroupRoundBytes) pass through the caches that
// the cores' several ranks share with each other and with the machine's other tenants. W=8 on the
// 2-core EPYC VM (512 KiB of L2 per core), 64 MiB: chorus-bench 62-97 ms, and the same copies and
// folds on one thread per core with nothing else (bench/staged_model.c) 57-84, against 33-47 for
// every rank's memcpy at once. So there a large all_reduce goes as a ring through the slots
// instead: a round's parts travel rank to rank, one step a phase; at step s rank r folds its input
// into part (r + s) mod W, reading that part's partial sum from the slot of rank r + 1, which
// folded it the step before, and writing it into its own. After W steps rank q's slot holds part
// q - 1 whole (its folder also kept it in its output), and every rank copies the parts out in the
// next round's first phase. A round is W parts of kRingRoundBytes / W: what stays in cache is one
// round's partial sums in two slots' parity, not W copies of it, for W phases a round instead of
// one. Same machine, chorus-bench, five interleaved runs, median of each run's median: W=8 64 MiB
// 57.5 ms against 78.8 staged (16 MiB 15.0 against 19.7, 1 MiB 0.70-0.88 against 1.08-1.60); W=4
// 64 MiB 30.3 against 38.3. Below kRingMinBytes the W phases cost more than the copies save (W=8,
// 512 KiB: 400-636 us against 259-392).
//
// A step needs only its neighbours: rank r + 1's partial sum of the step before, and rank r - 1
// done reading what r wrote two steps before (the slot of the same parity). So a step waits for
// those two alone (wait_rank), and a rank that finds them ahead goes on in its turn on a core
// instead of waiting for every rank of the group to have had one. Only the round's first two
// steps wait for every rank: the parts are copied out of every slot in the first, and in the
// second each slot of that parity is written again. Against a sync every step, same machine,
// interleaved: W=8 64 MiB 51-80 ms (median 60 over eleven runs) against 48-86 (64); W=4, six runs,
// 27-39 (32) against 29-41 (33). A small gain, within the machine's spread.
//
// A part's sum folds in ring order, starting at the part's first folder, so its bits depend on W
// and not on which rank computes it: still identical on every rank and from call to call, but not
// the rank-order fold of the other paths. A mean sums until the last fold, which divides by W.
// Folds of two operands would round f16/bf16 at every step, so those keep the staged path
// (reduce() folds all W inputs at once, accumulating halves in f32 and rounding once).
constexpr size_t kRingRoundBytes = 4 << 20;
constexpr size_t kRingMinBytes = 1 << 20;

bool rings(ShmGroup& g, const Call& c) {
  return c.kind == OpKind::AllReduce && g.world() > g.cores() && c.count * element_size(c.dtype) >= kRingMinBytes &&
         c.dtype != DataType::Float16 && c.dtype != DataType::BFloat16;
}

// Note [Ring through the slots]. `streams` as for all_reduce_direct.
void all_reduce_ring(ShmGroup& g, const Call& c, bool streams) {
  const int world = g.world(), me = g.rank(), next = (me + 1) % world;
  const size_t es = element_size(c.dtype), bytes = c.count * es;
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  auto& srcs = source_list(world);
  const RoundParts parts(c.count, std::min(g.slot_bytes(), kRingRoundBytes / size_t(world)) / es, es, world);
  const size_t rounds = parts.rounds();
  // Note [Streaming into the slots]; in place, copies out store normally (Note [Streaming stores]).
  SlotStores stores = g.slot_stores(c.kind, bytes, {.stream_out = !streams && c.in != c.out});
  const bool stream = stores.stream_out(streams) && c.in != c.out;
  const uint32_t base = g.phase();  // round k's step s is phase base + 1 + k W + s
  const int prev = (me + world - 1) % world;
  for (size_t k = 0; k <= rounds; ++k) {
    if (k >= 1) {  // the previous round's parts, each whole in the slot of its last folder
      g.wait_all(base + uint32_t(k * size_t(world)));
      for (int q = 0; q < world; ++q) {
        if (q == me) continue;  // my slot's part I folded last, and kept
        const int p = (q + world - 1) % world;
        const size_t b = parts.begin(k - 1, p), e = parts.begin(k - 1, p + 1);
        copy_out(out + b * es, g.read_slot(q), (e - b) * es, stream);
      }
    }
    if (k == rounds) break;
    for (int s = 0; s < world; ++s) {
      const int p = (me + s) % world;
      const size_t b = parts.begin(k, p), e = parts.begin(k, p + 1);
      const uint32_t n = base + 1 + uint32_t(k * size_t(world)) + uint32_t(s);
      if (s == 1 && k >= 1) {  // my slot held a whole part, which every rank copied out
        g.wait_all(n - 1);
      } else if (s >= 1) {  // the next rank's partial sum is in; the previous one has read mine
        g.wait_rank(next, n - 1);
        g.wait_rank(prev, n - 1);
      }
      if (s == 0) {
        stores.copy_in(g.write_slot(), in + b * es, (e - b) * es);
      } else {
        srcs[0] = g.read_slot(next);
        srcs[1] = in + b * es;
        const bool last = s == world - 1;  // a mean sums until the last fold, which divides by W
        reduce::reduce(c.dtype, last || c.op != ReduceOp::Mean ? c.op : ReduceOp::Sum, srcs.data(), 2, g.write_slot(),
                       e - b, {last ? out + b * es : nullptr, stream, stores.stream(), world});
      }
      if (k == 0 && s == 0) {  // everyone is in the call (and the calls compared): every slot is free
        g.sync();
        g.learn_slot_stores(stores);
      } else {
        g.post();
      }
    }
  }
  g.slot_stores_done(stores, bytes);
}
}  // namespace

void all_reduce(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const bool gets_result = c.kind == OpKind::AllReduce || me == c.root;
  const size_t es = element_size(c.dtype);
  const size_t bytes = c.count * es;
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  auto& srcs = source_list(world);

  if (world == 1) {  // the reduction of one input is that input (mean divides by 1)
    g.sync();
    if (gets_result) move_bytes(out, in, bytes);
    return;
  }
  if (bytes <= kInlineBytes || (bytes * size_t(world) <= kOneShotTotalBytes && bytes <= g.slot_bytes())) {
    const bool tiny = bytes <= kInlineBytes;
    SlotStores stores = g.slot_stores(c.kind, bytes);  // Note [Streaming into the slots]
    if (tiny)
      copy_bytes(g.my_inline(), in, bytes);
    else
      stores.copy_in(g.write_slot(), in, bytes);
    if (!gets_result) return g.post_last();  // Note [Owed waits]
    g.sync();
    g.learn_slot_stores(stores);
    // The own input from where it is, not from the own slot (that may have been streamed to
    // memory) nor from the own call line (Note [Migrating lines]).
    for (int p = 0; p < world; ++p) srcs[size_t(p)] = p == me ? in : tiny ? g.inline_of(p) : g.read_slot(p);
    reduce::reduce(c.dtype, c.op, srcs.data(), world, out, c.count);
    return g.slot_stores_done(stores, bytes);
  }

  // The call touches every rank's input and output (Note [Streaming stores]).
  const bool streams = streams_out(bytes, 2 * bytes * size_t(world));
  if (c.kind == OpKind::AllReduce && g.symmetric_made() != 0 && all_reduce_direct(g, c, streams)) return;
  if (rings(g, c)) return all_reduce_ring(g, c, streams);

  // Slot layout: [inputs of the round: W parts][my folded part of the previous round].
  // Parts start on cache lines (as far as the slot allows), so no store splits a line.
  const size_t round_bytes = std::min(g.slot_bytes(), std::max(g.chunk_bytes(), kGroupRoundBytes / size_t(world)));
  const RoundParts parts(c.count, round_bytes / ((size_t(world) + 1) * es), es, world);
  const size_t per_round = parts.per_round, folded_at = per_round * es, rounds = parts.rounds();
  // Note [Streaming into the slots]; in place, copies out store normally (Note [Streaming stores]).
  SlotStores stores = g.slot_stores(c.kind, bytes, {.stream_out = !streams && c.in != c.out});
  const bool stream = stores.stream_out(streams) && c.in != c.out;
  for (size_t k = 0; k <= rounds; ++k) {
    if (k < rounds) {
      uint8_t* slot = g.write_slot();
      for (int q = 0; q < world; ++q) {
        if (q == me) continue;
        const size_t b = parts.begin(k, q), e = parts.begin(k, q + 1);
        stores.copy_in(slot + (b - k * per_round) * es, in + b * es, (e - b) * es);
      }
    }
    if (k == rounds && !gets_result) return g.post_last();  // Note [Owed waits]
    g.sync();
    if (k == 0) g.learn_slot_stores(stores);
    if (k >= 1 && gets_result)
      for (int q = 0; q < world; ++q) {  // the others' folded parts of the previous round
        if (q == me) continue;
        const size_t b = parts.begin(k - 1, q), e = parts.begin(k - 1, q + 1);
        copy_out(out + b * es, g.read_slot(q) + folded_at, (e - b) * es, stream);
      }
    if (k < rounds) {  // fold my part: publish it, and keep it in the same pass
      const size_t b = parts.begin(k, me), e = parts.begin(k, me + 1);
      for (int p = 0; p < world; ++p)
        srcs[size_t(p)] = p == me ? in + b * es : g.read_slot(p) + (b - k * per_round) * es;
      reduce::reduce(c.dtype, c.op, srcs.data(), world, g.write_slot() + folded_at, e - b,
                     {gets_result ? out + b * es : nullptr, stream, stores.stream()});
    }
  }
  g.slot_stores_done(stores, bytes);
}

}  // namespace chorus::shm
