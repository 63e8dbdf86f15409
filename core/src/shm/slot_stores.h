// How a large message is written into the slots.
//
// Note [Streaming into the slots]: a large staged message crosses between the ranks one chunk
// per phase: a rank writes the chunk into its slot, and its peers read it after the next sync.
// Where the ranks' cores share a cache, a normally stored line goes from the writer's cache to
// the reader's, the fastest way there is. Where they do not (two dies of one package, two
// sockets), the reader fetches every line from the other die, one miss at a time, slower than
// memory. Streaming stores send the chunk to memory instead, which the reader then reads at
// memory's speed. On the Zen 5 VM, whose two vCPUs sit on one die or on two, switching every few
// minutes (a W=2 barrier takes 0.12 or 0.44 us), W=2, with normal against streaming stores:
//   on two dies:  all_reduce 64 MiB 8.1-8.3 against 6.2-6.4 ms, all_gather 64 MiB 9.0-9.5
//                 against 7.4-7.8, broadcast 64 MiB 3.3-3.5 against 2.9-3.0;
//   on one die:   all_reduce 6.8-6.9 against 10.3-10.5 ms, all_gather 9.1-9.8 against
//                 13.1-13.5, broadcast 3.1-3.3 against 4.8-4.9.
// (reduce_scatter gained nothing on two dies, so it stores normally.)
//
// The ranks cannot see which it is (a VM's topology is what its host says, and the host moves
// its vCPUs), so rank 0 measures: it times each large staged call per byte, from the call's
// first phase to its last, each kind of call apart; keeps the last time of each kind of store;
// and uses the faster one, trying the other at the 8th call and then every kTryEvery-th. A move
// between dies is noticed within that many calls, and the price is that one call in kTryEvery
// takes the slower way. Rank 0's choice travels in its call line (CallLine::streams); the other
// ranks read it after the first phase, so only their first chunk is written normally. Either
// choice moves the same bytes to the same places: it changes the speed, never the result, and
// no rank has to agree with another for correctness.
//
// Only a group with a core for every rank measures (Header::cores): with more ranks than cores,
// ranks that share a core share its caches, and rank 0's times swing with the scheduler. W=4 on
// the 2 cores, normal against streaming stores, three runs: all_reduce 64 MiB 14.2-16.1 against
// 15.2-21.9 ms, broadcast 64 MiB 6.7-6.9 against 6.7-8.4. Such a group stores normally.
// CHORUS_SHM_STREAM_SLOTS (CommunicatorOptions::shm.stream_slots) fixes the choice for any group:
// rank 0's setting decides for the group.
#pragma once

#include <cstddef>
#include <cstdint>

#include "call.h"
#include "shm/copy.h"

namespace chorus::shm {

// Rank 0's choice between normal and streaming stores into the slots, for one kind of call.
class SlotStoreChoice {
 public:
  // Messages at least this large per rank (the size from which outputs stream) choose.
  static constexpr size_t kMinBytes = kStreamMinBytes;
  static constexpr uint64_t kTryEvery = 32;

  // Whether the next large call streams.
  bool choose() {
    ++calls_;
    if (cost_[0] == 0) return false;
    if (cost_[1] == 0) return true;
    const bool faster = cost_[1] < cost_[0];
    // Once early too, so that one unlucky time does not hold for long.
    const bool other = calls_ % kTryEvery == 0 || calls_ == kTryEvery / 4;
    return other ? !faster : faster;
  }
  // What a call that streamed or not took, per byte.
  void took(bool streamed, double ns_per_byte) { cost_[streamed ? 1 : 0] = ns_per_byte; }

 private:
  double cost_[2] = {0, 0};  // ns per byte of the last call with normal / streaming stores; 0: none yet
  uint64_t calls_ = 0;
};

// One staged call's stores into the slots (ShmGroup::slot_stores).
struct SlotStores {
  bool stream = false;            // this rank's stores into its slot stream
  bool large = false;             // the call is large enough to choose
  OpKind kind{};                  // each kind of call is timed on its own: their times per byte differ
  Clock::time_point first_phase;  // rank 0's clock, once the first phase is done
};

}  // namespace chorus::shm
