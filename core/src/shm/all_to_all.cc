// All-to-all, even or uneven: per phase each rank writes the next chunk of the block meant for
// rank q into part q of its slot, and copies part `me` of every peer's slot into that peer's
// block of its output. Uneven counts are published with the call and checked pairwise before
// any data moves (what p sends to q must be what q expects from p); the number of rounds comes
// from the largest block anyone sends.
#include "shm/algorithms.h"
#include "shm/copy.h"

namespace chorus::shm {

void all_to_all(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  const bool uneven = c.kind == OpKind::AllToAllV;
  const size_t es = element_size(c.dtype);
  auto sent = [&](int q) { return uneven ? size_t(c.counts[size_t(q)]) : size_t(c.count); };
  auto received = [&](int p) { return uneven ? size_t(c.recv_counts[size_t(p)]) : size_t(c.count); };
  std::vector<size_t> sdispl(size_t(world) + 1, 0), rdispl(size_t(world) + 1, 0);
  for (int q = 0; q < world; ++q) {
    sdispl[size_t(q) + 1] = sdispl[size_t(q)] + sent(q);
    rdispl[size_t(q) + 1] = rdispl[size_t(q)] + received(q);
  }
  const auto* in = static_cast<const uint8_t*>(c.in);
  auto* out = static_cast<uint8_t*>(c.out);
  const size_t part = g.chunk_bytes() / (size_t(world) * es);

  size_t most = c.count;
  if (uneven) {
    g.sync();  // the call check: counts are consistent from here on
    most = 0;
    for (int p = 0; p < world; ++p)
      for (int q = 0; q < world; ++q) most = std::max<size_t>(most, g.counts_of(p)[q]);
  }
  if (in + sdispl[size_t(me)] * es != out + rdispl[size_t(me)] * es)
    move_bytes(out + rdispl[size_t(me)] * es, in + sdispl[size_t(me)] * es, sent(me) * es);
  size_t rounds = rounds_for(most, part);
  const bool stream = streams_out(most * es, 2 * most * es * size_t(world) * size_t(world));  // Note [Streaming stores]
  if (!uneven) rounds = std::max<size_t>(rounds, 1);
  for (size_t k = 0; k < rounds; ++k) {
    uint8_t* slot = g.write_slot();
    for (int q = 0; q < world; ++q)
      if (q != me)
        copy_bytes(slot + size_t(q) * part * es, in + (sdispl[size_t(q)] + k * part) * es,
                   in_round(sent(q), part, k) * es);
    g.sync();
    for (int p = 0; p < world; ++p)
      if (p != me)
        copy_out(out + (rdispl[size_t(p)] + k * part) * es, g.read_slot(p) + size_t(me) * part * es,
                 in_round(received(p), part, k) * es, stream);
  }
}

}  // namespace chorus::shm
