// How a staged message is written into the slots.
//
// Note [Streaming into the slots]: a staged message crosses between the ranks one chunk per
// phase: a rank writes the chunk into its slot, and its peers read it after the next sync.
// Where the ranks' cores share a cache, a normally stored line goes from the writer's cache to
// the reader's, the fastest way there is. Where they do not (two dies of one package, two
// sockets), two things are slow: the reader fetches every line from the other die, and, worse,
// the writer must take back every line of its slot from the reader, who read it last call, one
// line at a time (prefetching for ownership, PREFETCHW, did not help). Streaming stores send the
// chunk to memory instead: the writer takes nothing back, and the reader reads at memory's speed.
// A VM's vCPUs move between such places as the host pleases. On the 2-core Zen 4 VM they were,
// from second to second, in one of three states, told apart by a cache line's round trip between
// two processes pinned to the two vCPUs (times for a writer on one vCPU to store a message into
// shared memory and a reader on the other to copy it out, normal against streaming stores):
//   0.08 us round trip:  64 KiB 2.3 against 8.4 us,  1 MiB 44 against 80 us;
//   0.15 us:             64 KiB 9-11 against 6.7,   1 MiB 92-113 against 79;
//   0.52 us:             64 KiB 32-42 against 7.1,  1 MiB 450-600 against 79
// (in the slow states the writer's stores take 7-36 us of the 64 KiB; streaming ones 2). Streaming
// stores cost the same in every state; normal ones are the fastest way in the first state and
// up to 7x slower in the last. chorus-bench at W=2 in the 0.52 us state, normal against
// streaming: all_gather 64 KiB 34 against 7.8 us, 1 MiB 470 against 107; all_reduce 1 MiB 496
// against 99; broadcast 64 KiB 28 against 2.4, 16 MiB 6.2 against 0.9 ms; in the fast states
// the 1 MiB all_gather 116-127 against 148-156, the 1 MiB all_reduce 62 against 125.
// (reduce_scatter gained nothing on two dies, so it stores normally.)
//
// The ranks cannot see which state they are in, so rank 0 measures: it times each staged call of
// at least kMinBytes per rank (ticks(), from its first store into a slot to its return), each
// kind of call and size class apart (choice_index); keeps the last kKept times of each way of
// storing, of which the fastest counts (a call is only ever slowed, by a preemption or an
// interrupt); and uses the faster way, trying the other for two calls every kTryEvery-th call
// (and early, at the 8th and 16th), and switching only where the other is clearly faster
// (kSwitchBelow: the other way's kept times span more calls, and their fastest is the luckier
// for it). Not counted: the first call (first touches), and a call that stores the other way than
// the one before: it finds the slots as the other way left them, and is faster for it (W=2, 1 MiB
// all_gather, 0.15 us state: 98-115 us on the first call after a change, 128-144 on the next
// ones; counted, such calls made the choice swing between the two ways). A change of
// state is noticed within kKept calls if it slows the way in use, and within kTryEvery calls if
// it speeds up the other; the price is that two calls in kTryEvery take the slower way. Rank 0's
// choice travels in its call line (CallLine::streams); the other ranks store their first chunk as
// rank 0 chose in the last call of the same kind and size class, and read the choice after the
// first phase. Either choice moves the same bytes to the same places: it changes the speed, never
// the result, and no rank has to agree with another for correctness.
//
// With more ranks than cores as well: ranks that share a core share its caches, but half of the
// transfers still cross between the cores. W=4 on the 2 cores, normal against streaming, in the
// 0.52 us state: all_gather 1 MiB 1150 against 414 us, all_reduce 1 MiB 865 against 264,
// broadcast 1 MiB 480 against 39; in the fast states all_reduce 1 MiB 173-179 against 264-288.
// Rank 0's times swing more there, which the fastest of kKept times absorbs.
// CHORUS_SHM_STREAM_SLOTS (CommunicatorOptions::shm.stream_slots) fixes the choice for any group:
// rank 0's setting decides for the group.
#pragma once

#include <cstddef>
#include <cstdint>

#include "call.h"
#include "shm/copy.h"
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace chorus::shm {

// Rank 0's choice between normal and streaming stores into the slots, for one kind and size of call.
class SlotStoreChoice {
 public:
  // Messages at least this large per rank choose (Note [Streaming into the slots]).
  static constexpr size_t kMinBytes = 16u << 10;
  static constexpr uint64_t kTryEvery = 32;
  static constexpr size_t kKept = 3;            // times kept of each kind of store; the fastest counts
  static constexpr double kSwitchBelow = 0.85;  // the other way must be this much faster to switch

  // Whether the next call streams: the first two calls store normally, the next two stream, and
  // from then on the way in use until the other is clearly faster, but the other for two calls at
  // the 8th and 16th calls and every kTryEvery-th.
  bool choose() {
    ++calls_;
    if (calls_ <= 4) return calls_ >= 3;
    const double normal = cost(false), streaming = cost(true);
    if (normal == 0) return false;  // untimed (rank 0 had no part in the calls)
    if (streaming == 0) return true;
    // The way in use has its times from the last few calls; the other's come from trials spread
    // over many more, and the fastest of those is luckier: switch only on a clear difference.
    if (calls_ == 5 || (streams_ ? normal < kSwitchBelow * streaming : streaming < kSwitchBelow * normal))
      streams_ = streaming < normal;
    return tries_other() ? !streams_ : streams_;
  }
  // What a call that streamed or not took per byte, in ticks(). Not counted: the first call, which
  // pays for first touches (page faults, cold caches) whichever way it stores, and a call that
  // stored the other way than the call before, which finds the slots as the other way left them
  // (W=2, 1 MiB all_gather: the first call after a change took 98-115 us, the next ones 128-144).
  void took(bool streamed, double per_byte) {
    const bool changed = streamed != last_;
    last_ = streamed;
    if (calls_ == 1 || changed) return;
    Kept& k = kept_[streamed ? 1 : 0];
    k.times[k.next++ % kKept] = per_byte;
  }

 private:
  // Two calls the other way (the first of them not counted): at the 8th and the 16th call, so
  // that one unlucky time does not hold for long while few calls have been made, and then at
  // every kTryEvery-th.
  bool tries_other() const {
    if (calls_ < kTryEvery) return calls_ == 8 || calls_ == 9 || calls_ == 16 || calls_ == 17;
    return calls_ % kTryEvery <= 1;
  }
  struct Kept {
    double times[kKept] = {};  // ticks per byte of the last calls; 0: none yet
    size_t next = 0;
  };
  // The fastest of the kept times: a call is only ever slowed (a preemption, an interrupt), so the
  // fastest of a few says what the stores cost; 0 when none was timed yet.
  double cost(bool streamed) const {
    double best = 0;
    for (double t : kept_[streamed ? 1 : 0].times)
      if (t > 0 && (best == 0 || t < best)) best = t;
    return best;
  }
  Kept kept_[2];
  uint64_t calls_ = 0;
  bool streams_ = false;  // the way in use
  bool last_ = false;     // the way of the last call
};

// A cheap clock for comparing one way of storing with the other: the time-stamp counter where
// there is one, read without a fence. A fenced clock (steady_clock's vDSO read) after a call's
// last post waits there for the post's stores to land on the line a peer is watching: 16 KiB
// broadcasts at W=2 took 0.84 us instead of 0.30 with steady_clock at the end of the call.
inline uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
#endif
}

// Calls are timed by kind and size apart (sizes a factor of 4 apart, the last class open): their
// times per byte differ, and so may the faster store.
constexpr size_t kSizeClasses = 6;
constexpr size_t kChoices = 32 * kSizeClasses;  // OpKind < 32
inline size_t choice_index(OpKind kind, size_t bytes) {
  size_t c = 0;
  for (size_t from = SlotStoreChoice::kMinBytes * 4; from <= bytes && c + 1 < kSizeClasses; from *= 4) ++c;
  return size_t(kind) * kSizeClasses + c;
}

// One staged call's stores into the slots (ShmGroup::slot_stores).
struct SlotStores {
  bool stream = false;   // this rank's stores into its slot stream
  bool large = false;    // the call is large enough to choose
  size_t choice = 0;     // choice_index() of the call
  uint64_t started = 0;  // rank 0's ticks() when it timed the call, from its first store; 0: untimed
};

}  // namespace chorus::shm
