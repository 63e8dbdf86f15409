// Broadcast: the root streams the message through the slots a slot's worth at a time (a chunk
// here; with more ranks than cores a slot holds a few: Note [Deep slots when ranks share cores]),
// and the others copy each chunk out. A message of one or two chunks goes in the group's phases:
// the root writes a chunk into its slot while the others copy the previous one out of its other
// slot, and leaves once its last chunk is in (Note [Owed waits]). A longer one goes through every
// slot of the group (Note [Broadcast through every slot]). A message of 16 KiB and more may be
// streamed into the slots (Note [Streaming into the slots]). Tiny messages ride in the root's call
// line.
//
// Note [Broadcast through every slot]: in phases, every chunk is a sync of the whole group: each
// rank waits for every other one, 128 times for 64 MiB. With a core for every rank that costs
// little; with more ranks than cores each sync needs every rank to have had its turn on a core,
// so a core changes hands for every chunk (and a rank that waits for a peer waits for the peer's
// core-mates too), and a busy core makes every one of those turns late. But only the root writes
// in a broadcast: the others need nothing from each other, and the root needs from them only that
// they are done with a slot before it writes there again. So after a first sync (every rank has
// entered the call, which frees every slot of the group and compares the calls), the root writes
// chunk k into slot k of the ring of all 2W slots and posts, waiting only before it overwrites a
// slot, for the readers to have copied the chunk there; each reader waits only for the root's post
// of the chunk it copies next, and posts when it has copied it. Root and readers each work through
// up to 2W chunks per turn on a core (2 MiB at W=2; 16 MiB at W=4 and 32 MiB at W=8 on 2 cores,
// where the slots are deep). A last sync, after the last chunk, keeps every reader out of the
// next call until all are done with the slots; the root owes it (Note [Owed waits]). Every rank
// posts rounds + 1 phases, so the counters agree again after the call.
//
// Note [A ring the message outgrows]: a message the ring holds whole (up to 16 MiB at W=4 on 2
// cores) goes a slot per round, and its root writes it all and leaves: W=4 beside a CPU-bound
// process, 16 MiB, 2.4-3.6 ms against 5.7-6.9 through a 4 MiB ring. A larger one cycles through
// the ring again and again, and then what its memory holds matters more than how few handoffs it
// takes: the root's source, the readers' destinations and 16 MiB of slots do not stay in a 32 MiB
// L3 shared with the host's other tenants. So such a message goes one chunk per slot instead, the
// slot's first chunk: the same handoffs for each slot, a ring of a quarter of the memory (4 MiB
// at W=4). W=4 on 2 cores, 64 MiB, five alternating rounds of chorus-bench --tail beside a
// CPU-bound process: 21.0-23.5 ms (p95 28.5-32.5) against 26.7-30.6 (33.9-36.6) a slot per round;
// unloaded 18.0-20.7 against 20.0-21.2. W=8 (a 32 MiB ring of 2 MiB slots; 8 MiB this way): 31.6-
// 39.2 against 35.0-39.1 unloaded, medians 47.8 and 48.8 of seven rounds each beside the process.
// Going a chunk per round through all of the 16 MiB was no better than a slot per round (27.4-33.4
// against 28.2-31.5 in another session): the gain is the smaller ring.
//
// Note [Past the slots into the staging area]: a ring the message outgrows makes the root wait for
// its slowest reader before each slot it writes again, so with more ranks than cores its time holds
// every reader's copy of all but the ring's last 4 MiB (W=4: three 64 MiB copies on two cores,
// beside a busy process). Open MPI's root waits for one reader. So the root goes on into the
// group's staging area (segment.h, Note [A staging area for large broadcasts]) when the next slot
// is not free yet: the message's chunks land in the slots as long as the readers keep up, in the
// staging area where they fall behind (the staging area a ring of its own), and the root waits
// only once both the next slot and the next staged place hold a chunk some reader has not copied
// out, for the older of the two. Which place chunk k went to is in a table at the staging area's
// start, written before chunk k's post; a reader reads it after the post. With 64 MiB staged the root of a 64 MiB broadcast writes it all and leaves.
// Rank 0's time (the root), chorus-bench --tail, W=4 on 2 cores, 64 MiB, alternating rounds, median
// ms: beside a CPU-bound process 18.4-18.9 and 17.6-19.4 against 25.5-29.2 through the slots alone
// (Open MPI 16.0-24.8); unloaded 11.8-12.6 against 14.2-15.3 (Open MPI 12.9-15.0); W=8 loaded 31.4-
// 32.2 against 34.7-40.6 (Open MPI 72-76). The last rank, unloaded, is where it was (W=2 64 MiB
// 6.9-8.9 against 7.1-8.3). Staging every chunk from the first on, not only where the slots were
// taken, gave the last rank of a 16 MiB broadcast at W=2 1.93-2.04 ms against the slots' 1.69-1.76:
// the slots stay in cache, the staging area does not.
//
// Note [Staging for readers away]: with a core for every rank, a reader that still holds the next
// slot is copying on a core of its own, most likely, and frees it within a chunk's copy. Going on
// into the staging area then costs the root more than waiting: where the 2-core Zen 3 VM's vCPUs
// share no cache (barrier 0.31-0.41 us), a W=2 64 MiB broadcast's root took 6.46 ms staging where
// the slot was not free, 5.32 with no staging area and b609d2a's (two slots, no staging) 5.43, 60
// alternating rounds of chorus-bench; where they share one, 5.40, 5.23 and 5.38. So there the root
// waits for the slot as long as its own last chunk took, and stages as before once it was not freed
// in that: the reader is away (preempted, or sharing its core with a busy thread), and from then on
// for the rest of the call. 50 more rounds: 5.06 ms against 5.53 staging at once, 4.79 with none and
// 4.99 for b609d2a in that state; 4.85, 4.74, 4.82 and 5.09 in the other. With more ranks than cores
// a reader that holds the slot waits for a core, and the root stages at once.
//
// Note [The root first]: with more ranks than cores a reader shares its core with the root as
// often as not, and then every chunk it copies while the root still writes takes the root's turn
// on that core: the root of a 64 MiB broadcast at W=4 on 2 cores took two memcpys' time, its own
// and its core-mate's, where Open MPI's root waits for one reader's copy. The readers need the
// root's chunks, not the other way round, so a reader that finds the root last posted from its
// own CPU, and still able to write on without it (the root has not posted the last chunk it may
// write before this reader's next copy frees a place), yields that CPU once before each chunk it
// copies: the root writes on, and the reader copies after it. Only for a message the ring cannot
// hold, which leaves the cache anyway: a 16 MiB broadcast at W=4 fits the ring, and there the
// last rank, copying after the root rather than a slot behind it, read the slots from memory
// rather than from its 2 MiB of L2: 3.9-4.2 ms against 3.0-3.9, though its root took 1.20 against
// 1.39-1.42 (Open MPI 1.83-1.95). 64 MiB, alternating rounds on a 2-core Xeon VM, rank 0's median
// ms (the last rank's): W=4 unloaded 6.95-7.45 against 12.3-13.6 (13.1-14.7 against 13.0-14.9),
// beside a CPU-bound process 7.6-9.5 against 16.8-19.3 (21.3-24.0 against 20.7-22.2); W=8
// 8.0-8.8 against 18.1-22.5 (23.0-24.0 against 24.1-24.2). Open MPI's root took 12.0-12.1,
// 15.6-24.7 and 43.1-44.4 in the same rounds, its last rank 34-36 ms at W=4. A rank bound to a
// core of its own never shares one with the root; where the root waits for another, slower reader,
// the yield costs a switch there and back.

#include <atomic>
#include <vector>

#include "shm/algorithms.h"
#include "shm/copy.h"
#include "shm/waiter.h"

namespace chorus::shm {

namespace {

// Note [Past the slots into the staging area]: where chunk k of a broadcast that outgrows the ring
// went, a place of the ring's slots or of the staging area: entry k % kPlaceEntries of a table at
// the start of the staging area, written by the root before it posts chunk k.
constexpr size_t kPlaceEntries = 1024;
constexpr size_t kPlaceTableBytes = kPlaceEntries * sizeof(uint32_t);

// Note [Broadcast through every slot]. `streams`: the group's buffers outgrow the caches (broadcast()).
void broadcast_through_ring(ShmGroup& g, const Call& c, uint8_t* buf, size_t bytes, bool streams) {
  const bool root = g.rank() == c.root;
  const size_t ring = g.slot_count();
  // Note [A ring the message outgrows]: one chunk per slot when the slots cannot hold it all.
  const bool outgrows = bytes > ring * g.slot_bytes();
  const size_t chunk = outgrows ? g.chunk_bytes() : g.slot_bytes();
  const size_t rounds = rounds_for(bytes, chunk);
  const uint32_t base = g.phase();
  const size_t first = g.write_slot_index(c.root);  // the only slot free before the first sync
  if (outgrows) g.reserve_stage();                  // Note [Past the slots into the staging area]
  SlotStores stores = g.slot_stores(c.kind, bytes, {.stream_out = !streams});  // Note [Streaming into the slots]
  const bool stream = stores.stream_out(streams);                              // the readers' copies out
  if (root) stores.copy_in(g.slot_at(first), buf, in_round(bytes, chunk, 0));
  g.sync();  // phase base + 1: everyone is in the call; chunk 0 is in
  g.learn_slot_stores(stores);
  // Places [0, ring) are the ring's slots from `first` on, [ring, places) the staging area's
  // chunks. A chunk stays in its place until every reader has copied it out, so the root writes
  // chunk k only once the slowest reader has copied out chunk k - places or a later one; the table
  // holds more entries than there are places, so it writes entry k % kPlaceEntries again only
  // after every reader has read it.
  size_t staged = 0;
  if (outgrows && g.stage_ready() && g.stage_bytes() > kPlaceTableBytes && ring + 1 < kPlaceEntries)
    staged = std::min((g.stage_bytes() - kPlaceTableBytes) / chunk, kPlaceEntries - 1 - ring);
  const size_t places = ring + staged;
  auto* table = reinterpret_cast<std::atomic<uint32_t>*>(g.stage());
  auto place = [&](size_t j) {
    return j < ring ? g.slot_at((first + j) % ring) : g.stage() + kPlaceTableBytes + (j - ring) * chunk;
  };
  if (root) {
    // held[j]: the last chunk in place j, which the readers post base + 2 + held[j] for once they
    // copied it out. Slots first, as long as the readers keep up: they stay in cache.
    std::vector<int64_t> held(places, -1);
    held[0] = 0;
    size_t next_slot = 1 % ring, next_staged = ring;
    auto is_free = [&](size_t j) { return held[j] < 0 || g.all_reached(base + 2 + uint32_t(held[j])); };
    // Note [Staging for readers away]: with a core for every rank, the next slot is waited for as
    // long as the root's last chunk took, until once it is not freed within that.
    bool waits_for_slot = staged && g.world() <= g.cores();
    Clock::duration last_copy{};  // timed only while the root may still wait
    for (size_t k = 1; k < rounds; ++k) {
      size_t j = next_slot;
      if (waits_for_slot && !is_free(j)) {
        const auto until = Clock::now() + last_copy;
        while (!is_free(j) && Clock::now() < until) cpu_relax();
        waits_for_slot = is_free(j);
      }
      if (staged && !is_free(j) && (is_free(next_staged) || held[next_staged] < held[j])) j = next_staged;
      if (held[j] >= 0) g.wait_all(base + 2 + uint32_t(held[j]));
      if (j < ring)
        next_slot = (next_slot + 1) % ring;
      else
        next_staged = next_staged + 1 == places ? ring : next_staged + 1;
      held[j] = int64_t(k);
      if (staged) table[k % kPlaceEntries].store(uint32_t(j), std::memory_order_relaxed);
      const auto copy_from = waits_for_slot ? Clock::now() : Clock::time_point{};
      stores.copy_in(place(j), buf + k * chunk, in_round(bytes, chunk, k));
      if (waits_for_slot) last_copy = Clock::now() - copy_from;
      g.post();  // phase base + 1 + k: chunk k is in
    }
    g.post_last();  // phase base + 1 + rounds, owed: every reader is done with the slots
    return g.slot_stores_done(stores, bytes);
  }
  for (size_t k = 0; k < rounds; ++k) {
    if (k >= 1) g.wait_rank(c.root, base + 1 + uint32_t(k));
    // Note [The root first]: hand the CPU to the root while it can write chunks this rank does
    // not hold up (up to k + places - 1: chunk k - 1 copied out frees the place of k - 1 + places).
    if (outgrows) g.yield_to(c.root, base + 1 + uint32_t(std::min(rounds - 1, k + places - 1)));
    const size_t j = k == 0 ? 0 : staged ? table[k % kPlaceEntries].load(std::memory_order_relaxed) : k % ring;
    copy_out(buf + k * chunk, place(j), in_round(bytes, chunk, k), stream);
    g.post();  // phase base + 2 + k: chunk k is copied out
  }
  g.wait();  // phase base + 1 + rounds on every rank
}

}  // namespace

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
  const bool streams = streams_out(bytes, bytes * size_t(g.world()));  // Note [Streaming stores]
  if (rounds > 2) return broadcast_through_ring(g, c, buf, bytes, streams);
  SlotStores stores = g.slot_stores(c.kind, bytes, {.stream_out = !streams});  // Note [Streaming into the slots]
  const bool stream = stores.stream_out(streams);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t n = in_round(bytes, chunk, k);
    if (root) stores.copy_in(g.write_slot(), buf + k * chunk, n);
    if (root && k + 1 == rounds) {
      g.post_last();  // Note [Owed waits]
      return g.slot_stores_done(stores, bytes);
    }
    g.sync();
    if (k == 0) g.learn_slot_stores(stores);
    if (!root) copy_out(buf + k * chunk, g.read_slot(c.root), n, stream);
  }
  g.slot_stores_done(stores, bytes);
}

}  // namespace chorus::shm
