// How a staged message is written into the slots, or whether it is read from the peers instead.
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
// The ranks cannot see which state they are in, so rank 0 measures: it times the staged calls of
// at least kMinBytes per rank (ticks(), from its first store into a slot, or its first phase, to
// its return; one in a few where the way in use goes on steadily, Note [Timing a few calls]), each
// kind of call and size class apart (choice_index); keeps the last kKept times of each way, of
// which the fastest counts (a call is only ever slowed, by a preemption or an interrupt); and uses
// the fastest way, switching only where another is clearly faster (kSwitchBelow: the other way's
// kept times span more calls, and their fastest is the luckier for it). Not counted: the first
// call (first touches), and a call that goes another way than the one before: it finds the slots
// as the other way left them, and is faster for it (W=2, 1 MiB all_gather, 0.15 us state: 98-115
// us on the first call after a change, 128-144 on the next ones; counted, such calls made the
// choice swing between the two ways). A change of state is noticed within kKept timed calls if it
// slows the way in use (and by each rank within a call where it slows normal stores, Note
// [Falling back within a call]); to notice one that speeds up another way, each other way is
// tried for two calls now and then, the more rarely the slower it was, so that trials cost about
// kTryShare of the time (schedule(): a way 50% slower is tried every 50
// calls, twice as slow every 100, ten times every 900), but a way timed only once is tried again
// sooner: the first calls of a size run on buffers still warming up (memory a process has not used
// for a while is slow for its first milliseconds, Note [Warm buffers] in bench/chorus_bench.cc),
// and a way timed once there is judged on that call (W=2, 1 MiB all_gather: normal stores timed
// once, on the second call, at up to 2.3x what they took 15 calls later, and not tried again in the
// 50 calls after). Where it was timed before the way in use first was, it is tried again as its
// cost says, but within kTryClose calls and not before kTryLeast (8% slower, 8 calls later; 32% or
// more, 32). Where it was timed after, kTryClose calls later: a later call runs on warmer buffers,
// so a way timed once after the way in use, and slower, was not misjudged on colder ones (its one
// time may have met a preemption). Nor where its one time was more than kColdMost times the way in
// use's, more than warming was seen to explain: it is tried as a way loud on two times is, every 2
// (s - 1) / kTryShare calls and at least kTryLoudOnTwo apart (W=2, 64 MiB all_gather beside a
// CPU-bound process, in the slowest state: normal stores at 82-98 ms on their first calls against
// streaming's 24, tried again 8 calls later at 74-76 ms, two of compare.py --load's 40 timed calls,
// which set its p95: 82 ms against Open MPI's 54; tried 64 calls later, as in a first build of this
// rule, the W=2 16 MiB all_gather's normal stores, timed once at 3.9 times streaming's time with
// the matmul before each call, came back at calls 73-74, two of the 40 timed after 40 untimed, at
// 10.5 ms against 2.6-5.1: the run's p95, against Open MPI's 8.3-9.8). And the times a trial was
// set from may be stale by the time it falls due: it is set again from the same call by the times
// as they are then, where schedule() set it. The way in use's first counted call may have been a
// slow one, and its later calls bring its cost down (the same 64 MiB all_gather: streaming's second
// call at 39 ms, its next ones at 17-24, so normal stores timed once at 97 ms looked 2.5 times
// slower, not more than kColdMost, and were tried 8 calls later at 77-79 ms, the p95 in two runs of
// three, 79.1 and 73.7 ms against Open MPI's 51.6).
// Tried 8 calls later, as every way timed once was, a W=2 16 MiB all_gather's streaming stores and
// single copy (timed at its 4th and 7th calls, after normal stores at its 2nd) came back at calls
// 17-21, at 1.0-3.1x normal stores' time: 4 of chorus-bench's 10 timed calls after its 10 untimed
// (median 4.96 ms against 3.99 for b609d2a's, which tried its one other way once at the 8th call).
// Tried 32 calls later, calls 8 to 20 all went normal stores in 6 runs of 8 (in the other two
// normal stores took 9-12 ms on their first calls and on their trial at calls 17-18, and streaming,
// at 4-5, was kept). And tried 8 calls later whatever their cost, as ways timed before the way in
// use were until the fourth way came (Note [Streaming out with the slots]), a W=2 16 MiB
// all_reduce's streaming and normal stores (timed at its 4th and 2nd calls, 1.7 and 1.25 times the
// fourth way's time) came back at calls 16-19, again 4 of the 10 timed calls: on the 2-core AMD
// EPYC VM (Zen 3), alternating rounds against b609d2a, 3.66 ms against 3.20 (4 rounds), where with
// their trials 25 and 32 calls later it took 2.76 against 2.97 (6 rounds). A way that cold buffers
// put far behind is found later for it (the 1 MiB all_gather's normal stores, 2.2 times streaming's
// time on their second call, tried again at calls 41-42, at 150 us against streaming's 200-300).
// The next trial is set once a trial's own time is in, and again at the call back after it
// (took()): set from the times before the trial, as it was, the gap followed the cold calls the
// trial was there to look past (W=2, 1 MiB all_gather: normal stores at 350 us on the second call,
// 231 on their trial 15 calls later, tried next 68 calls after that, where they took 137 against
// the single copy's 170-250). Trials at a fixed two calls in 32 (6%) were the slowest
// 5% of calls wherever the other way was much slower, and made chorus's tail: W=2, 2 threads of
// matmul between calls (compare.py --load matmul), a 1 MiB broadcast's p95 took 426-433 us against
// a median of 41-42 (Open MPI's p95: 198-200), and 48-50 us with the way fixed by
// CHORUS_SHM_STREAM_SLOTS=1. And a way close to the one in use is tried often, so that its kept
// times are as recent as the way in use's, and it is taken once it is faster by more than
// kSwitchBelow: at W=2, 64 KiB, which of the single copy below and the slots is faster changes with
// the state, and so did the way the runs took (their medians 7.8-8.7 us where the single copy was
// taken, 10.1-11.5 where the slots were; Open MPI 10.5-11.5).
// But not every 8 calls, as a way timed once may be (kTryLeast): at least kTryClose apart. With
// three close ways, trials 8 calls apart put half the calls in a trial or in the change of way
// after one, and those are the slower calls (the 2-core Xeon VM, W=2, 1 MiB all_gather with the
// matmul before each call, five alternating rounds: p95 344-452 us with trials of close ways 32
// calls apart against 355-474 at 8, medians even; unloaded, four rounds, 1 MiB 240-268 against
// 249-266 us, p95 301-342 against 326-457, 16 MiB 4.71-5.05 against 4.98-5.16 ms). 32 calls of 1
// MiB take 10 ms, and a state lasts seconds.
// A trial costs more than its counted call: its first call finds the slots as the other way left
// them, and so does the call back after it. On the Xeon VM (model 167), W=2: a 1 MiB broadcast's
// streaming trial took 190-200 us on its first call and 75-80 on its second, where normal stores
// took 45; a 1 MiB all_gather's trial of normal stores 200-250 us and then 161, against single
// copies at 140. With the two slower ways tried 32-42 calls apart, 8% of the calls were trial calls
// over 160 us, and beside a CPU-bound process those calls were the p95 of 400: 267-309 us against
// Open MPI's 234-270, and 221-241 with streaming stores barred. So each trial keeps its slowest
// call, the first and the call back included (peak_), and a slower way whose trial took more than
// kLoud times the way in use, once it has kKept times as the way in use has, is tried at least
// kTryLoud calls apart: three calls in 256, out of the p95 (bench/compare.py --load, three runs
// each: 214-257 us against 268-328 before, Open MPI 260-278; medians 142-154 against 144-164). A
// change of state that makes it the faster way is then seen within 256 calls, 40 ms at 1 MiB. A
// close way whose trials are quiet keeps its pace (64 KiB all_gather, single copies against normal
// stores: every call of a trial within 10% of the way in use).
// kLoud was 1.25 at first; trials of ways 10-25% slower were quiet by it, and their calls, with the
// call back after them, took 10% of the calls, the p95's share (W=2, 16 MiB all_gather with the
// matmul before each call: normal stores tried every 32-35 calls at 1.1-1.2 times the single
// copy's time, and the single copy's first call back 1.07-1.16). And a way needed kKept times to be
// judged loud: timed once in the first phase and again 8 calls later, it was tried a third time
// 32 calls after that, so that the first 60 calls of a size held three rounds of trials. Now a
// way may be judged loud from its second time, where its times also say it is more than kLoud
// slower, and is then tried 64 calls apart until it has kKept (kTryLoudOnTwo). The W=2 16 MiB
// all_gather with the matmul, 40 calls timed after 40 untimed, three alternating rounds: p95
// 3.32-3.66 ms against 4.06-4.17 before, Open MPI 3.36-5.48 (a first build of the rule, which
// judged a way so on any two times); compare.py --load matmul, median / p95 of three runs: 2.75 /
// 2.82 ms against Open MPI's 2.98 / 3.07, and W=4's 16 MiB broadcast 1.31 / 1.46 against 1.66 /
// 1.90 (1.33 / 3.05 against 1.75 / 4.53 before).
// A slow spell of the machine slows whichever way is in use (on the same VM normal stores took
// 75-80 us instead of 45 for 8 to 60 calls of a 1 MiB broadcast in a row, now and then), and the
// way in use's three kept times then turn the choice to a way with older, faster times, while the
// way left behind keeps the spell's. So the way left behind is tried again kTryClose calls later,
// whatever its times (W=2, 1 MiB all_gather beside the CPU-bound process: single copies left at
// 190 us for normal stores at 177 were not tried again for 256 calls, and normal stores, 160 once
// the spell was over, made the run's median: 165 us against the single copies' 140). A way that
// has fewer than kKept times is not judged loud for good: its few times may all have met a spell
// (in a build that judged such a way loud at kTryLoud, a 1 MiB broadcast's normal stores timed
// twice at 80 us, streaming's 78 taken, and the call back to streaming after their trial 195:
// normal stores were not tried again in the run, whose median was 80 us against 45-50). Judged loud
// on two times close to the way in use's, as in a first build of the rule above, the same
// broadcast's normal stores came back 64 calls after their second trial, past the first half of
// runs of 100 calls: states.py, 10 rounds, 80 us in 7 against Open MPI's 79, where a way within
// kLoud is tried again 32 calls later.
//
// An all_gather has a third way (Note [Single-copy collectives]): each rank writes its block into
// its peers' outputs through the kernel, one copy instead of two. Reading the peers' inputs, as it
// first did, it won in the 0.15 us state (W=2, 64 KiB 8.6 against 10.2 us through the slots, 1 MiB
// 104 against 127) and lost in the 0.52 us one (1 MiB 204 against 109). Every rank must take it, or
// none: its first phase publishes buffers, not data. So rank 0 chooses one call ahead: at the start
// of a call it decides the way of the next call of the same kind and size class, and publishes it
// in its call line (kLineNextWay), which every rank reads after the call's first phase
// (learn_slot_stores) and follows in that next call. Every rank of an all_gather passes that phase,
// so they all go the same way. The ways of storing need no agreement: they move the same bytes to
// the same places, and a rank that leaves a call before its first phase (a broadcast's root, Note
// [Owed waits]) stores its own way until it learns rank 0's.
// A single copy after calls through the slots takes three calls to reach its pace, not two (the
// Xeon VM, W=2, 16 MiB all_gather, rank 0's times: 1.6x, 1.3x, then 1.0-1.07x its steady time,
// 8% under the slots'). Timed on its second call it was never taken; trials of it are three
// calls, the last counted (kUncounted). Taken, alternating rounds of chorus-bench against
// mpi_tail --fresh (four; three with the matmul): 2.71-2.96 ms against 2.99-3.12 through the slots,
// Open MPI 2.74-2.97; with the matmul before each call 2.79-2.91 against 3.04-3.13 (Open MPI
// 2.83-2.86); beside a CPU-bound process 6.64-6.94 against 6.92-7.05 (Open MPI 2.77-6.72); 4 MiB
// 682-724 against 720-727 us.
// But the single copy needs no slots, and its calls leave them idle. Memory left idle for a few
// milliseconds is slow again on these VMs (Note [Warm buffers] in bench/chorus_bench.cc), so its
// times and theirs were not taken alike. On the 2-core AMD EPYC VM (Zen 3), W=2, 1 MiB all_gather,
// rank 0's times of each call: normal stores tried after some 30 single copies took 161-194 us on
// their first call and 119-144 on their second, the counted one, against the single copy's
// 146-165; taken, they came down to 95-120 over ten calls and more, and with single copies turned
// off the row took 122-141 us against 173-180 (chorus-bench, alternating rounds). And the first
// calls of a size, which time each way in turn, run on buffers still warming up, normal stores'
// most: their second call took 127-413 us, 1.3-2 times their time 40 calls later (b609d2a, which
// chose no way below 4 MiB, went from 880 us to 84-90 over its first 25 calls), while streaming
// stores and the single copy were timed after them, on warmer buffers; the first choice took the
// single copy or streaming in most runs, and normal stores came back only at a trial, after which
// they ran slower for tens of calls (Note [A spell after a trial]). So:
//   - Below kWarmBelow (4 MiB a rank: a call takes under a millisecond, and the buffers warm over
//     tens of calls), normal stores, the first way, go on for kWarmCalls more calls before the
//     others are timed: 16 calls, by which b609d2a's took 1.0-1.5 times their steady time (1 MiB
//     all_gather 85-109 us against 84-90 later, broadcast 54-70 against 35-50).
//     From 4 MiB a call's first touches are the warming, and each way has its first calls only.
//   - The first choice is among the ways through the slots. The single copy's time from the
//     first calls only sets its first trial (8 calls on where it was the faster, kTryLeast; else as
//     a way timed once after the way in use), and the time of that trial, three calls against a way
//     through the slots in use and warm, is weighed as the first choice weighs, without
//     kSwitchBelow's margin (the Xeon VM's 16 MiB all_gather, 8% faster by single copies).
//   - After single copies, a way through the slots is counted on its third call, not its second,
//     and its trials are three calls (uncounted()).
// Timing the first way again after the others instead, at its third call, did not help: after
// streaming stores it met their spell (a 1 MiB broadcast's normal stores at 224-248 us against
// streaming's 63-70, where they took 35-45 once warm). chorus-bench at W=2 on the Zen 3 VM, 25
// alternating rounds of each build, medians of the rounds in the VM's fast state (barrier under
// 0.25 us; 16-18 rounds each), these rules against 15de51d's and b609d2a's: all_gather 1 MiB 127
// us against 155 and 97, all_reduce 1 MiB 81 against 79 and 73, broadcast 1 MiB 38 against 36 and
// 37, all_gather 64 KiB 7.2 against 6.8 and 6.3; 16 MiB within 3%. In its slow state (barrier
// 0.33-0.52 us; 7-9 rounds each) 128 against 128 and 230 us, 106 against 101 and 245, 44 against
// 44 and 145. What is left of the fast state's 1 MiB all_gather is the trials' (streaming stores
// and the single copy at calls 55-59, 32 calls after the first choice) and the spell of slower
// normal stores after them (97-111 us before, 125-146 for the 40 calls after).
//
// A call whose copies out the group's bytes leave to normal stores, of kStreamMinBytes or more a
// rank, has a fourth way, normal stores into the slots and streaming ones out of them, and a fifth,
// streaming both (Note [Streaming out with the slots] in shm/copy.h), timed after the others.
//
// With more ranks than cores as well: ranks that share a core share its caches, but half of the
// transfers still cross between the cores. W=4 on the 2 cores, normal against streaming, in the
// 0.52 us state: all_gather 1 MiB 1150 against 414 us, all_reduce 1 MiB 865 against 264,
// broadcast 1 MiB 480 against 39; in the fast states all_reduce 1 MiB 173-179 against 264-288.
// Rank 0's times swing more there, which the fastest of kKept times absorbs.
// CHORUS_SHM_STREAM_SLOTS (CommunicatorOptions::shm.stream_slots) fixes the way of storing for
// any group, CHORUS_SHM_SINGLE_COPY (shm.single_copy) whether all_gathers read their peers;
// rank 0's settings decide for the group.
//
// Note [Timing a few calls]: what rank 0 does after a call's copy into the slots costs more than
// its instructions. The copy's stores are still on their way to the reader's cache when it ends,
// and every store after them waits for a place behind them. The 2-core Xeon VM, W=2, a 64 KiB
// broadcast (its root copies the message into a slot, posts and returns), normal stores fixed, 20
// alternating runs of chorus-bench: 50 stores to one line after the post made its median 2.6%
// slower, 200 stores 7.2%; the same 200 before the copy, nothing. Timing a call ends in took(),
// some twenty stores to lines the copy has pushed out of L1, and the watch of each copy (Note
// [Falling back within a call]) stores too: with every call timed, that broadcast took 2.8-5.3%
// longer than b609d2a's (40 alternating runs each, twice), whose root never timed a call of one
// chunk, and 2.7-4.5% longer than with the way fixed (CHORUS_SHM_STREAM_SLOTS=0), where rank 0
// times nothing. So:
//   - Where the way in use goes on steadily (the choice settled, no trial, its third call in a row
//     or later: the call back after a trial is timed for the trial's peak, the next one counted),
//     rank 0 times one call in every kUntimedTicks of such calls by the way's cost, about 19 us at
//     this VM's 2.6 GHz counter: one in four at 64 KiB, every one at 1 MiB. A way in use that
//     slows is then seen within kKept timed calls (12 calls of 64 KiB, 70 us); the long calls Note
//     [Falling back within a call] is for are all timed, and the trials fall where they did: they
//     count calls, not times.
//   - The watch does not time a call's first kUnwatched copies of normal stores: it does not judge
//     them.
//   - Before the copy, less is done too: choose() weighs the times only once a trial falls due or a
//     time came in (WayChoice::quiet_), and rank 0 stores the next way into its call line only where
//     it changed, instead of reading its own line back (Note [Migrating lines]) and storing it again.
// The same 64 KiB broadcast, 40 alternating runs of each, the median of each run's ratio to the
// b609d2a run beside it: 1.028 before, 0.996 after (95% bootstrap interval 0.978-1.016), 1.001 with
// the way fixed.
//
// Note [A spell after a trial]: on the Xeon VM (model 167) normal stores into the slots slow down
// for 8 to more than 80 calls at a time, to streaming's pace (W=2, 1 MiB broadcast: 78-90 us a call
// against 45-53), and such a spell comes after whatever pushes the slots' lines out of the caches,
// calls of streaming stores above all. Rank 0's time of each of the 100 calls of a run, 50 runs: in
// 48 a spell began 1 to 8 calls after a call of streaming stores, the first calls' or a trial's;
// with normal stores fixed and two calls of streaming ones forced, in 5 runs of 8. So a trial costs
// the spell after it too, which its own calls and the call back do not show: in runs of 2000 calls
// of that broadcast, trials of streaming 70 and then 256 calls apart made the mean 58.4 us against
// 49.6 with normal stores fixed (medians of 8 alternating runs' means). After calls of another way,
// rank 0 watches the way in use's next kAfterCalls calls (a window, its counted calls among them):
// their time over the way's cost before the window, where more than kLoud times that cost, stands
// for a spell the other way set off, in calls of the way in use (spell_), and its trials come as
// much later (schedule(): 2 (s - 1) + spell calls' worth is kTryShare of the calls between trials,
// whatever its count of times). A spell of 0.7 over the window's 24 calls puts the next trial some
// 900 calls later; a window with none clears it. The same runs: mean 51.1 us. A spell that came of
// itself is taken for the trial's too, and the next trial comes late; a change of state that slows
// the way in use is seen in its own times all the same, and one that speeds the other way up within
// kTryMost calls.
// But the window after the first calls runs on buffers still warming up, and a way timed there
// before the way in use (normal stores, below kWarmBelow) was timed on colder ones: it is tried
// again within kTryClose calls whatever spell the window saw, as such a way is (schedule()). On the
// Zen 3 VM, W=2, 1 MiB broadcast (rank 0's times, a scratch build that logs them): normal stores at
// 48.5 us on their 16th call, still coming down, and streaming at 44.5-45.7 taken; in the window
// streaming took 56-58 us in 8 of its 24 calls and 112 in one, a spell that put normal stores'
// trial past the run's 100 calls, all streamed at 44-46 us, where runs that tried normal stores
// some 33 calls on took them at 29-41.
#pragma once

#include <cstddef>
#include <cstdint>

#include "call.h"
#include "shm/copy.h"
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace chorus::shm {

// The ways a staged call of at least WayChoice::kMinBytes per rank may move its data.
enum class Way : uint8_t {
  kNormal,      // through the slots, normal stores
  kStream,      // through the slots, streaming stores
  kSingleCopy,  // reading the peers' buffers (all_gathers only: Note [Single-copy collectives])
  kStreamOut,   // through the slots, normal stores, and streaming copies out (Note [Streaming out with the slots])
  kStreamBoth,  // through the slots, streaming stores, and streaming copies out (the same Note)
};
constexpr int kWays = 5;
constexpr unsigned way_bit(Way w) { return 1u << unsigned(w); }

// Rank 0's choice of the way of one kind and size of call, one call ahead (Note [Streaming into the slots]).
class WayChoice {
 public:
  // Messages at least this large per rank choose.
  static constexpr size_t kMinBytes = 16u << 10;
  // Below this, a call's first way goes on for kWarmCalls more calls before the others are timed
  // (Note [Streaming into the slots]).
  static constexpr size_t kWarmBelow = 4u << 20;
  static constexpr uint64_t kWarmCalls = 14;
  static constexpr size_t kKept = 3;           // times kept of each way; the fastest counts
  static constexpr double kSwitchBelow = 0.9;  // another way must be this much faster to switch
  // Trials of the other ways take about this share of the time of such calls: a way s times
  // slower than the way in use is tried for two calls every 2 (s - 1) / kTryShare calls, at
  // least kTryClose and at most kTryMost apart; a way timed once, again after as many calls but
  // kTryLeast to kTryClose where it was timed before the way in use first was, else after
  // kTryClose, and as a way loud on two times where it was more than kColdMost times slower than
  // the way in use.
  static constexpr double kTryShare = 0.02;
  static constexpr uint64_t kTryLeast = 8, kTryClose = 32, kTryMost = 1024;
  // More than warming buffers slowed a way on its first calls (up to 2.3-2.6 times).
  static constexpr double kColdMost = 3.0;
  // A trial is loud where one of its calls, or the call back after it, took more than kLoud times
  // the way in use: such a way, slower and with kKept times, is tried at least kTryLoud calls
  // apart, so that trials stay out of the slowest 5% of calls (Note [Streaming into the slots]);
  // with two times, both more than kLoud times the way in use, kTryLoudOnTwo.
  static constexpr double kLoud = 1.1;
  static constexpr uint64_t kTryLoud = 256, kTryLoudOnTwo = 64;
  // Calls of the way in use watched after another way's, for a slow spell they set off (Note [A
  // spell after a trial]).
  static constexpr uint64_t kAfterCalls = 24;
  // Calls of a way that are not counted where it follows another way (and at the first call): they
  // find the slots, or the pages the kernel pins, as the other way left them. A single copy reaches
  // its pace on its third call (Note [Streaming into the slots]), the slots on their second, and
  // on their third after single copies, which left them idle (uncounted()).
  static constexpr int kUncounted[kWays] = {1, 1, 2, 1, 1};
  // The calls of way w not counted after calls of way `before` (w itself: the first calls of a size).
  static constexpr int uncounted(Way before, Way w) {
    return kUncounted[int(w)] + (before == Way::kSingleCopy && w != Way::kSingleCopy ? 1 : 0);
  }

  // Where the way in use goes on steadily, rank 0 times one call in about this many ticks() of its
  // calls, by the way's cost (Note [Timing a few calls]).
  static constexpr double kUntimedTicks = 50000;

  // The way of the call after the one being made, a call of `bytes` per rank, among the `allowed`
  // ways (way_bit()s): each allowed way first (normal, streaming, single copy) for its uncounted()
  // calls and one counted, the first for kWarmCalls more below kWarmBelow; then the fastest of the ways
  // through the slots, the way in use until another is clearly faster, but each other way for as
  // many calls now and then (trials), the less often the slower it was. The first call goes the
  // first allowed way.
  Way choose(unsigned allowed, size_t bytes);
  // Whether the call being made is timed (took()), as the last choose() decided with its way: every
  // call but where the way in use goes on steadily (Note [Timing a few calls]).
  bool timing() const { return timing_now_; }
  // What a call that went way `w` took per byte, in ticks(). Not counted: the first call, which
  // pays for first touches (page faults, cold caches) whichever way it goes, and the first
  // uncounted() calls of a way after another, which find the slots as that way left them (W=2, 1 MiB
  // all_gather: the first call with normal stores after streaming ones took 98-115 us, the next ones 128-144).
  // A trial's time also sets when its way is tried next (schedule()).
  void took(Way w, double per_byte);

 private:
  struct Kept {
    double times[kKept] = {};  // ticks per byte of the last calls; 0: none yet
    size_t next = 0;
  };
  // The fastest of the kept times: a call is only ever slowed (a preemption, an interrupt), so the
  // fastest of a few says what the way costs; 0 when none was timed yet.
  double cost(Way w) const;
  size_t timed(Way w) const;   // how many times of way w are kept (at most kKept)
  double latest(Way w) const;  // the last time of way w kept; 0: none
  // Sets when way `w` is tried next, counting from call `from` (Note [Streaming into the slots]),
  // by its times so far and the way in use's.
  void schedule(Way w, uint64_t from);
  Way decide(unsigned allowed, size_t bytes);  // choose()'s way
  void close_window();                         // Note [A spell after a trial]
  // The window after calls of way after_way_, from call after_from_ to after_end_ (0: none open):
  // the way in use's cost when it opened, and its counted calls in it, timed, and their time over
  // that cost, in that cost, where more than kLoud times it.
  Way after_way_ = Way::kNormal;
  uint64_t after_from_ = 0, after_end_ = 0;
  double after_base_ = 0, after_over_ = 0;
  int after_timed_ = 0;
  double spell_[kWays] = {};  // what a way's last calls set off, in calls of the way in use (0: nothing)
  // decide() weighed the times and found nothing to do before call quiet_until_ (the next trial), with
  // the ways quiet_allowed_: until then, or until a time comes in, the way in use goes on.
  bool quiet_ = false;
  unsigned quiet_allowed_ = 0;
  uint64_t quiet_until_ = 0;
  bool timing_now_ = true;   // the call being made is timed
  bool timing_next_ = true;  // the call decided last is
  // Calls in a row that went one way, and the way before them.
  struct Run {
    Way way = Way::kNormal;
    Way after = Way::kNormal;  // way itself: no call before them
    uint64_t calls = 0;
    void add(Way w) {
      if (w != way || calls == 0) {
        after = calls == 0 ? w : way;
        calls = 0;
      }
      ++calls;
      way = w;
    }
    // The first of them that find the slots as the way before left them (uncounted()).
    uint64_t uncounted_calls() const { return uint64_t(uncounted(after, way)); }
  };
  Run decided_run_;     // of the calls decided
  double untimed_ = 0;  // ticks() of the calls left untimed since the last timed one, by the way's cost
  Kept kept_[kWays];
  double peak_[kWays] = {};           // the slowest call of each way's last trial, or of the call back after it
  uint64_t next_try_[kWays] = {};     // the call that starts the next trial of each way; 0: none set
  uint64_t scheduled_[kWays] = {};    // the call next_try_ counts from where schedule() set it; 0: set otherwise
  uint64_t first_timed_[kWays] = {};  // the call decided when each way's first time came in; 0: none yet
  uint64_t decided_ = 1;              // the call last decided (the first goes the first allowed way)
  Way use_ = Way::kNormal;            // the way in use
  bool settled_ = false;              // use_ was taken from every allowed way's time
  unsigned unweighed_ = 0;            // way_bit()s of the ways left out of the choice until a trial of theirs is timed
  unsigned weigh_now_ = 0;            // of those whose first trial's time came in, for the next choice to weigh
  int trial_left_ = 0;                // calls of the trial of way tried_ still to decide after the last one decided
  Way tried_ = Way::kNormal;
  Run timed_run_;          // of the calls timed
  bool in_trial_ = false;  // the last call timed was a trial's, of way trial_way_
  Way trial_way_ = Way::kNormal;
  double trial_peak_ = 0;  // the slowest of its calls so far
  bool leaving_ = false;   // use_ was just changed from left_; no call of use_ timed since
  Way left_ = Way::kNormal;
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

// Calls are timed by kind and size apart (sizes a factor of 4 apart, from 64 MiB open): their
// times per byte differ, and so may the faster way (an all_gather's single copy is allowed below
// 64 MiB only: single_copy_window()).
constexpr size_t kSizeClasses = 7;
constexpr size_t kChoices = 32 * kSizeClasses;  // OpKind < 32
inline size_t choice_index(OpKind kind, size_t bytes) {
  size_t c = 0;
  for (size_t from = WayChoice::kMinBytes * 4; from <= bytes && c + 1 < kSizeClasses; from *= 4) ++c;
  return size_t(kind) * kSizeClasses + c;
}

// What a staged call may do besides storing into the slots (ShmGroup::slot_stores()).
struct OtherWays {
  bool read_peers = false;  // read its peers' buffers, where single_copy() (Note [Single-copy collectives])
  // stream its copies into user buffers, which streams_out() leaves to normal stores (Note
  // [Streaming out with the slots]), where its messages are kStreamMinBytes or more
  bool stream_out = false;
};

// Note [Falling back within a call]: rank 0 sees a change of the machine's state only in the
// times of whole calls, kKept of them, and the call after them was already decided: four calls of
// the way that became slow. Where a call is long that is what sets a tail: W=2, 64 MiB all_gather
// beside a CPU-bound process, normal stores at 27-37 ms a call until, mid-run, four took 80-101
// ms before streaming ones took over at 18-31; two slow calls of chorus-bench's 40 timed make its
// p95 (82.7 ms against Open MPI's 50.6). Each rank sees the change sooner, in its own copies into
// its slot: in the same VM's fast state a 512 KiB chunk stored normally took 32-41 us (median of
// a call's chunks; 55-62 at their 90th percentile), streamed 41-53; after the change 178-210
// normally, 27-30 streamed. So every rank times its copies into the slots of at least
// kWatchBytes (copy_in()) and keeps, for each kind and size class of call, the fastest it
// streamed per byte (its pace); a copy of normal stores slower than kFallBack times that pace,
// kSlowInRow times in a row, makes the rest of the call's stores on that rank streaming ones. Not
// judged: a call's first kUnwatched copies, slower in every state (up to 87 us in the fast one).
// The ways of storing need no agreement (Note [Streaming into the slots]), so each rank falls
// back alone. Rank 0 counts such a call as normal stores that took as long as the call plus what
// its copies after falling back would have taken more at the pace of the slow ones (owed), so
// that its choice still turns to streaming within kKept calls, now cheap ones, and back once a
// trial of normal stores is fast again.
// The way of one staged call (ShmGroup::slot_stores).
struct SlotStores {
  Way way = Way::kNormal;
  // this rank's stores into its slot stream
  bool stream() const { return way == Way::kStream || way == Way::kStreamBoth || fell_back(); }
  // Whether the call's copies into user buffers stream: where `group` (streams_out(): the group's
  // buffers outgrow the caches), or where its way says so (Note [Streaming out with the slots]).
  bool stream_out(bool group) const { return group || way == Way::kStreamOut || way == Way::kStreamBoth; }
  bool large = false;    // the call is large enough to choose
  size_t choice = 0;     // choice_index() of the call
  uint64_t started = 0;  // rank 0's ticks() when it timed the call, from its first store; 0: untimed
  // This rank's fastest streamed copy into a slot, in ticks() per byte, of calls of this choice;
  // null where the call is not watched (Note [Falling back within a call]).
  double* stream_pace = nullptr;
  int copies = 0;        // copies of normal stores of at least kWatchBytes into the slots so far
  int slow_run = 0;      // the last of them, in a row, slower than kFallBack times the pace
  double slow_pace = 0;  // ticks per byte of the fastest of them
  double owed = 0;       // ticks the copies after falling back would have taken more at slow_pace

  static constexpr size_t kWatchBytes = 64u << 10;
  static constexpr double kFallBack = 4.0;
  static constexpr int kSlowInRow = 2, kUnwatched = 2;
  // This rank streams the rest of the call's stores: once it does, its copies no longer count.
  bool fell_back() const { return slow_run >= kSlowInRow; }
  // Copies n bytes of src into a slot (or the staging area) this call's way, watched.
  void copy_in(void* slot, const void* src, size_t n);
};

}  // namespace chorus::shm
