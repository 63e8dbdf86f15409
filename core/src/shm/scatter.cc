// Scatter: the root writes, per phase, the next chunk of every other rank's block into that
// rank's part of its slot; each rank copies its part out. The root keeps its own block locally.
#include "shm/algorithms.h"
#include "shm/copy.h"

namespace chorus::shm {

void scatter(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const bool root = me == c.root;
  const size_t es = element_size(c.dtype);
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  if (root && in + size_t(me) * c.count * es != out) move_bytes(out, in + size_t(me) * c.count * es, c.count * es);
  const size_t part = g.chunk_bytes() / (size_t(world) * es);
  const size_t rounds = std::max<size_t>(1, rounds_for(c.count, part));
  const bool stream = streams_out(c.count * es, 2 * c.count * es * size_t(world));  // Note [Streaming stores]
  for (size_t k = 0; k < rounds; ++k) {
    const size_t n = in_round(c.count, part, k);
    if (root) {
      uint8_t* slot = g.write_slot();
      for (int q = 0; q < world; ++q)
        if (q != me) copy_bytes(slot + size_t(q) * part * es, in + (size_t(q) * c.count + k * part) * es, n * es);
      if (k + 1 == rounds) return g.post_last();  // Note [Owed waits]
    }
    g.sync();
    if (!root) copy_out(out + k * part * es, g.read_slot(c.root) + size_t(me) * part * es, n * es, stream);
  }
}

}  // namespace chorus::shm
