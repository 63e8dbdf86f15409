// Broadcast: the root streams the message through its slot one chunk per phase; the others
// copy each chunk out while the root already writes the next one into its other slot. The root
// leaves once its last chunk is in its slot (Note [Owed waits]). A large message may be streamed
// into the slot (Note [Streaming into the slots]). Tiny messages ride in the root's call line.

#include "shm/algorithms.h"
#include "shm/copy.h"

namespace chorus::shm {

void broadcast(ShmGroup& g, const Call& c) {
  const bool root = g.rank() == c.root;
  const size_t bytes = c.count * element_size(c.dtype);
  auto* buf = static_cast<uint8_t*>(c.out);
  if (bytes <= kInlineBytes) {
    if (root) {
      copy_bytes(g.my_inline(), buf, bytes);
      return g.post_last();  // Note [Owed waits]
    }
    g.sync();
    copy_bytes(buf, g.inline_of(c.root), bytes);
    return;
  }
  const size_t chunk = g.slot_bytes();
  const size_t rounds = rounds_for(bytes, chunk);
  SlotStores stores = g.slot_stores(c.kind, bytes);  // Note [Streaming into the slots]
  for (size_t k = 0; k < rounds; ++k) {
    const size_t n = in_round(bytes, chunk, k);
    if (root) copy_out(g.write_slot(), buf + k * chunk, n, stores.stream);
    if (root && k + 1 == rounds) {
      g.post_last();  // Note [Owed waits]
      return g.slot_stores_done(stores, bytes);
    }
    g.sync();
    if (k == 0) g.learn_slot_stores(stores);
    if (!root) copy_out(buf + k * chunk, g.read_slot(c.root), n, bytes >= kStreamMinBytes);
  }
  g.slot_stores_done(stores, bytes);
}

}  // namespace chorus::shm
