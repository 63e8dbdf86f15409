// All-gather and gather, even or uneven (the V forms): every rank streams its contribution through
// its slot one chunk per phase, and every receiving rank copies each peer's chunk to that peer's
// place in the output. Contributions that fit in kInlineBytes ride in the call line. A rank's own
// contribution is copied locally (nothing to do when gathered in place). The blocks land in one
// output, or each in a buffer of its own (all_gather_to), at the same cost. Between symmetric
// buffers each rank writes its block into every output itself (Note [Direct all_gather]); on
// ordinary buffers, in the sizes where it is faster, each rank writes its block into its peers'
// outputs through the kernel (Note [Single-copy collectives]). Contributions of 16 KiB and more may
// be streamed into the slots (Note [Streaming into the slots]).
#include <numeric>

#include "shm/algorithms.h"
#include "shm/copy.h"
#include "shm/peer_read.h"

namespace chorus::shm {

namespace {
// The direct path copies this much of the input at a time to every output, so it is read once.
constexpr size_t kDirectPieceBytes = 64 * 1024;
// A single-copy all_gather writes its block to its peers this much at a time (Note [Single-copy
// collectives]).
constexpr size_t kPushPieceBytes = 256 * 1024;

// Note [Direct all_gather] (Note [Direct collectives]): when every rank's output lies in
// symmetric memory, each rank writes its own block into every rank's output itself, starting
// with the next rank's, so the ranks spread over the outputs. Each input byte is read once and
// each output byte written once, and nothing passes through the slots. False (after one phase)
// sends every rank down the staged path.
bool all_gather_direct(ShmGroup& g, const Call& c, const std::vector<size_t>& displ, bool stream) {
  const int world = g.world(), me = g.rank();
  const size_t es = element_size(c.dtype);
  const size_t mine = (displ[size_t(me) + 1] - displ[size_t(me)]) * es, at = displ[size_t(me)] * es;
  DirectBuffers d;
  if (!d.exchange(g, c.in, c.out, mine, displ.back() * es, {DirectBuffers::kOut})) return false;
  const auto* in = static_cast<const uint8_t*>(c.in);
  for (size_t x = 0; x < mine; x += kDirectPieceBytes) {
    const size_t n = std::min(kDirectPieceBytes, mine - x);
    for (int k = 1; k <= world; ++k) {
      const int q = (me + k) % world;
      uint8_t* dst = d.at(q, DirectBuffers::kOut) + at + x;
      if (dst != in + x) copy_out(dst, in + x, n, stream);
    }
  }
  g.sync();  // every output is written
  return true;
}

// Note [Single-copy collectives]: each rank writes its block into every peer's output, starting
// with the next rank's, so the ranks spread over their peers. It copies its block into its own
// output a piece at a time and writes the same piece to its peers while the piece is in its cache,
// so the input is read from memory once. Blocks of kStreamMinBytes and more go into the rank's own
// output with streaming stores: the rank never reads that copy again in the call, and a normal
// store would first read each line from memory while the peers' writes compete for it (the Xeon
// VM, W=2, 16 MiB all_gather, single copy forced, five alternating rounds on a morning its memory
// copied at half its usual speed: 2.96-3.34 ms against 3.40-4.03, Open MPI 3.53-4.36; four rounds
// of 4 MiB: 611-660 us against 585-669). Smaller blocks store normally, as chorus's other copies
// into user buffers do (Note [Streaming stores]): their output may stay in the caches for whoever
// reads it next (1 MiB streamed took 92-98 us against 98-106, where chorus-bench reads none of it).
// False (after the phases) sends every rank down the staged path.
template <class Block>
bool all_gather_single_copy(ShmGroup& g, const Call& c, const std::vector<size_t>& displ, Block&& block,
                            const SlotStores& way) {
  const int world = g.world(), me = g.rank();
  const size_t es = element_size(c.dtype);
  std::vector<uint8_t*> places(size_t(world), nullptr);
  for (int q = 0; q < world; ++q) places[size_t(q)] = block(q);
  PeerTargets to;
  const bool everyone = to.exchange(g, places);
  g.learn_slot_stores(way);
  if (!everyone) return false;
  const auto* in = static_cast<const uint8_t*>(c.in);
  uint8_t* own = block(me);
  const size_t mine = (displ[size_t(me) + 1] - displ[size_t(me)]) * es;
  const bool stream = mine >= kStreamMinBytes;
  for (size_t x = 0; x < mine; x += kPushPieceBytes) {
    const size_t n = std::min(kPushPieceBytes, mine - x);
    if (own != in) copy_out(own + x, in + x, n, stream);  // nothing to do gathered in place
    for (int k = 1; k < world; ++k) to.write((me + k) % world, x, in + x, n);
  }
  return to.finish();
}
}  // namespace

void gather(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const bool uneven = c.kind == OpKind::AllGatherV || c.kind == OpKind::GatherV;
  const bool gets = c.kind == OpKind::AllGather || c.kind == OpKind::AllGatherV || me == c.root;
  const size_t es = element_size(c.dtype);
  auto count_of = [&](int p) { return uneven ? size_t(c.counts[size_t(p)]) : size_t(c.count); };
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  size_t most = 0;
  for (int p = 0; p < world; ++p) most = std::max(most, count_of(p));
  const size_t mine = count_of(me);
  if (most * es <= kInlineBytes) {  // every block rides in its rank's call line: one phase
    copy_bytes(g.my_inline(), in, mine * es);
    if (!gets) return g.post_last();  // Note [Owed waits]
    g.sync();
    uint8_t* place = out;  // where the next block goes in out
    for (int p = 0; p < world; ++p) {
      const size_t n = count_of(p) * es;
      move_bytes(c.outs.empty() ? place : static_cast<uint8_t*>(c.outs[size_t(p)]), p == me ? in : g.inline_of(p), n);
      place += n;
    }
    return;
  }
  std::vector<size_t> displ(size_t(world) + 1, 0);
  for (int p = 0; p < world; ++p) displ[size_t(p) + 1] = displ[size_t(p)] + count_of(p);
  // Where rank p's block goes: its place in out, or its own buffer (all_gather_to).
  auto block = [&](int p) { return c.outs.empty() ? out + displ[size_t(p)] * es : static_cast<uint8_t*>(c.outs[p]); };
  const bool all_gather = c.kind == OpKind::AllGather || c.kind == OpKind::AllGatherV;
  // The inputs, and every rank's output (all_gather) or the root's (gather).
  const bool stream =
      streams_out(most * es, displ.back() * es * size_t(all_gather ? world + 1 : 2));  // Note [Streaming stores]
  if (all_gather && c.outs.empty() && g.symmetric_made() != 0 && displ.back() * es >= kDirectMinBytes &&
      all_gather_direct(g, c, displ, stream))
    return;
  SlotStores stores =  // Note [Streaming into the slots]
      g.slot_stores(c.kind, most * es, {.read_peers = all_gather, .stream_out = gets && !stream});
  if (stores.way == Way::kSingleCopy) {
    if (all_gather_single_copy(g, c, displ, block, stores)) return g.slot_stores_done(stores, most * es);
    stores = {};  // normal stores, untimed, the way of the next call learned
  }
  const bool stream_out = stores.stream_out(stream);  // Note [Streaming out with the slots]

  uint8_t* own = gets ? block(me) : nullptr;
  const bool in_place = own == in;
  const size_t chunk = g.chunk_bytes() / es;
  const size_t rounds = std::max<size_t>(1, rounds_for(most, std::max<size_t>(chunk, 1)));
  for (size_t k = 0; k < rounds; ++k) {
    const size_t n = in_round(mine, chunk, k);
    uint8_t* slot = g.write_slot();
    stores.copy_in(slot, in + k * chunk * es, n * es);
    if (!gets && k + 1 == rounds) return g.post_last();  // Note [Owed waits]
    g.post();
    // The own block goes out while the peers still fill their slots: from the slot while it is in
    // cache (the input is read once), or from the input if the slot was streamed to memory.
    if (gets && !in_place)
      copy_out(own + k * chunk * es, stores.stream() ? in + k * chunk * es : slot, n * es, stream_out);
    g.wait();
    if (k == 0) g.learn_slot_stores(stores);
    if (!gets) continue;
    for (int p = 0; p < world; ++p)
      if (p != me)
        copy_out(block(p) + k * chunk * es, g.read_slot(p), in_round(count_of(p), chunk, k) * es, stream_out);
  }
  g.slot_stores_done(stores, most * es);
}

}  // namespace chorus::shm
