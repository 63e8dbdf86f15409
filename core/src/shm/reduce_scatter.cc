// Reduce-scatter: the input holds W blocks; rank q ends with the fold of everyone's block q.
// Per phase each rank writes the next chunk of every other rank's block into that rank's part
// of its slot; each rank then folds its own block's chunk from all slots in rank order
// 0..W-1 (its own chunk straight from its input), so the result does not depend on timing.
#include "reduce/reduce_kernels.h"
#include "shm/algorithms.h"

namespace chorus::shm {

namespace {
// Note [Direct reduce_scatter] (Note [Direct collectives]): when every rank's input lies in
// symmetric memory, each rank folds its block straight from every rank's input, in rank order,
// into its own output; no block passes through the slots. False (after one phase) sends every
// rank down the staged path.
bool reduce_scatter_direct(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const size_t bytes = c.count * element_size(c.dtype);
  DirectBuffers d;
  if (!d.exchange(g, c.in, c.out, bytes * size_t(world), bytes, {DirectBuffers::kIn})) return false;
  auto& srcs = source_list(world);
  for (int p = 0; p < world; ++p) srcs[size_t(p)] = d.at(p, DirectBuffers::kIn) + size_t(me) * bytes;
  reduce::reduce(c.dtype, c.op, srcs.data(), world, c.out, c.count);
  g.sync();  // nobody reads this rank's input any more
  return true;
}
}  // namespace

void reduce_scatter(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const size_t es = element_size(c.dtype);
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  if (g.symmetric_made() != 0 && c.count * es * size_t(world) >= kDirectMinBytes && reduce_scatter_direct(g, c)) return;
  const size_t part = g.chunk_bytes() / (size_t(world) * es);
  const size_t rounds = std::max<size_t>(1, rounds_for(c.count, part));
  auto& srcs = source_list(world);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t n = in_round(c.count, part, k);
    uint8_t* slot = g.write_slot();
    for (int q = 0; q < world; ++q)
      if (q != me) copy_bytes(slot + size_t(q) * part * es, in + (size_t(q) * c.count + k * part) * es, n * es);
    g.sync();
    if (n == 0) continue;
    for (int p = 0; p < world; ++p)
      srcs[size_t(p)] = p == me ? in + (size_t(me) * c.count + k * part) * es : g.read_slot(p) + size_t(me) * part * es;
    reduce::reduce(c.dtype, c.op, srcs.data(), world, out + k * part * es, n);
  }
}

}  // namespace chorus::shm
