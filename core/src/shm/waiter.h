// How a rank waits for shared-memory words written by other processes.
//
// Note [Waiting with more ranks than cores]: spinning is fastest when every rank has a core,
// and ruinous when ranks outnumber cores (the spinner burns the time slice the awaited rank
// needs). So a wait spins briefly, then yields the core for a while, then sleeps on a futex on
// the awaited word. Posters wake sleepers only when the word's waiters count is non-zero, so
// the fast path costs no system call.
// The spin is bounded in time rather than in rounds (a pause instruction takes 10 to 140
// cycles, by CPU), and it runs only where it can help. The scheduler often puts two ranks on
// one core even when there are as many cores as ranks (nearly always, here, with a CPU-bound
// process beside them), and then the awaited rank runs only once the spinner stops: spinning
// 4000 rounds (about 200 us) made every such wait cost 200 us, and an 8-byte all_reduce beside
// a CPU-bound process took a median of 198 us. So each rank records the CPU it last posted from,
// and a wait on a peer that last ran on the waiter's own CPU does not spin at all. A peer on
// another core is worth a longer spin (50 us): a rank that yields may hand its core to whatever
// else is runnable for a time slice. Against a 1 us spin for every wait, beside a CPU-bound
// process, an 8-byte all_reduce went from 6.0 to 4.3 us (median) and a 1 MiB one's p95 from
// 2.2-2.6 ms to 0.2-2.3 ms (Open MPI, whose ranks spin and so keep both cores, took 0.2 us and
// 0.2 ms, and left the CPU-bound process less of a core). After the spin a rank whose peer is
// merely late loses little by yielding: sched_yield on an otherwise idle core returns at once,
// and the wait keeps polling between yields.
// When oversubscribed a wait does not spin (but for a rank alone on its CPU: Note [A rank alone
// beside busy cores]): the awaited rank, on any core, is as likely to
// be waiting for its turn on that core as running, and then every spin is lost. In a barrier at
// W=4 on 2 cores each core hands over once per barrier; a 1 us spin before yielding made the mean
// barrier 2.7-3.0 us, no spin 1.8-2.1 (Open MPI's, same runs: 2.6-2.7). "Not at all" means not
// one round of pauses either: a wait that cannot spin yields as soon as its first reads miss (the
// rank it waits for may be the one that needs this core). Zen 5 VM, W=4 on 2 cores, rank 0's
// median of 20,000 calls, 4 interleaved runs with and without one round of 16 pauses: barrier
// 4.2-6.4 -> 3.3-3.6 us, 8-byte all_reduce 4.3-4.9 -> 3.5-3.6. Four later runs beside Open MPI's
// (bench/mpi_tail.c): barrier 2.9-4.5 against 3.0-4.9, 8-byte all_reduce 3.0-3.5 against 3.4-7.4.
// Nor 64 plain reads before the first yield, which a wait that may spin makes: 4. Xeon VM, W=4 on 2
// cores, placed two to a core, rank 0's median of 1000 calls, 6 alternating rounds: barrier
// 1.65-1.67 us against 1.77-1.84, 8-byte all_reduce 1.71-1.75 against 1.84-1.90 (one read: the
// same as four); W=8, 3 rounds: barrier 4.02-4.15 against 4.26-5.54.
// The yielding is shorter too, 1 ms against 2 when every rank has a core. A thread in sched_yield
// stays runnable, and the fair scheduler may give it its share of a core, taken from the ranks that
// compute: on a Zen VM a DDP step at W=4 on 2 cores, whose collectives wait on peers still in their
// backward pass, exposed 55-62 ms of communication with 2 ms of yielding and 37-41 ms with 100 us.
// But a rank that sleeps must be woken and then wait for a core, and its peers wait with it: on a
// 2-core Xeon VM (Linux 6.18), each rank running bench/compare.py's matmul step between calls, the
// ranks that finished their step first slept in the barrier before each call after 100 us, and the
// calls that met a rank still waking made the p95, as the sweep bears out (the sleeps were not
// counted; Open MPI's ranks yield without end and never sleep). chorus-bench --np 4 --tail, the
// 8-byte and 1 KiB all_reduce and all_gather, two rounds, p95 by the time yielded: 100 us 36-51 us,
// 300 us 5-35, 600 us 5-18, 1 ms 6-14, 2 ms 6-15 (Open MPI with passive OpenMP threads, three other
// rounds: 12-31); W=8, 100 us 66-116 against 1 ms 28-43 (Open MPI 48-105). Yielding cost the
// compute nothing there: 3000 such steps took 2.27-2.55 s with 1 ms against 2.45-2.69 with 100 us.
// In the same session Fabric's DDP step (bench/libraries_bench.py, W=4) exposed 48.3-49.5 ms with
// 1 ms of yielding (4 runs), 45.3-49.7 with 100 us (7) and 48.5-51.0 with 2 ms (7);
// chorus-ddp-bench's did not move beyond noise. What it cost: a 64 MiB all_reduce at W=4, every
// call's output checked in full before the next (chorus-bench without --check-last, 10 calls), took
// either about 29 ms or about 40: 8 runs of 9 took 36-42 with 1 ms of yielding, none of 9 with
// 100 us (28.5-32.3); W=8 59-79 against 58-66 (6 runs each). Checking the last call only, as
// bench/compare.py does, 26.5-27.8 against 26.8-28.5 (7 runs each). The slow calls were those run
// by ranks spread unevenly over the CPUs, which ranks that yield keep so: Note [Evening out a long
// call].
//
// Note [Ranks sharing the cores]: "oversubscribed" counts the job's ranks on this machine, not the
// group's. A shared-memory group holds the ranks of one host, but hosts that are network
// namespaces or containers on one kernel share its cores: there 2 ranks per host on 2 cores spin
// as if they had a core each while the other hosts' ranks need those cores to move their data.
// Every group learns which of its ranks share this kernel (the boot id each publishes,
// Communicator's host identity) and which CPUs each may use (its affinity), and notes how many
// ranks and how many CPUs between them; a wait counts the most it has seen of each. Counting the
// CPUs of all the ranks, not this process's own, is what keeps a rank bound to one core (by
// chorusrun, Note [A core for every rank], or by mpirun or srun) from taking itself for one of
// several ranks crowding that core. On
// namespace hosts of this 2-core machine (bench/hosts_bench.sh, chorus-bench, 2 runs each,
// back to back), before and after: 2 hosts x 2 ranks, barrier 103-105 -> 69-73 us, 8-byte
// all_reduce 113-121 -> 76-83, 64 KiB 206-214 -> 109-122; 3 x 2, barrier 197-210 -> 171.
//
// Note [Spinning on a core of one's own]: a rank bound to CPUs that no other rank of its job may
// use (Note [A core for every rank]: chorusrun and chorus-bench bind ranks that do not outnumber
// the cores; mpirun does too) spins for as long as an unbound one would yield, 2 ms. The scheduler
// cannot move it, so yielding only hands its core to another process for a time slice: beside a
// CPU-bound process, which the scheduler moves onto whichever core a rank yields, a 1 MiB broadcast
// at W=2 took a median of 1.17-1.24 ms with a 50 us spin and 0.08-0.18 ms with 2 ms (Open MPI's
// ranks, which spin without end, 0.09-0.20 in the same runs). The rank's own other threads may
// still need the core: a DDP step at W=2 with its all_reduce overlapping the backward pass did
// not change beyond noise.
//
// Note [A rank alone beside busy cores]: with more ranks than cores and a CPU-bound process beside
// them, the scheduler may settle with three ranks of four on one CPU and the fourth beside the
// process on the other: three runnable tasks against two, too even for its balancer to move one.
// The three wait for the fourth, yield, sleep, and their CPU goes idle. The fourth, let
// on after the process's time slice, posts, wakes them (tens of us from an idle vCPU), and yields
// while they wake: the process takes another whole slice, a 4 ms tick. Every call then takes a
// slice until the scheduler moves a rank. perf sched, W=4 on 2 cores, 1000 barriers beside one
// CPU-bound process: runs of 12 to 140 calls of 3.9-4.0 ms each, in 5 of 8 runs (means 3.0-27 us,
// medians 4.0-4.4). Yielding helps no rank there: none of its group runs on that CPU. So a rank that
// no rank of its group last posted from its CPU spins on its peers as one with a core for every rank
// does (50 us), then yields. W=4, 8 alternating runs: barrier means 2.1-3.3 us and no slice (Open
// MPI's 3.9-6.3 in the same runs, medians 3.7-5.9); W=8, 4 runs: p95 12.3-13.6 us against
// 76-3996 before (means 27-62 against 183-712; Open MPI's median was a slice in 2 of the 4).
// Unloaded, and beside the matmul step of bench/compare.py --load matmul, the medians did not move
// beyond noise. Only where the group holds every rank on these cores (Note [Ranks sharing the
// cores]): on namespace hosts the other hosts' ranks may need that CPU.
//
// Note [Evening out a long call]: ranks that outnumber the cores run where the scheduler puts them
// (Note [Ranks placed, not bound]), and it may leave them spread unevenly: three ranks of four on
// one CPU and one on the other, or five of eight and three. A long call then goes at the pace of
// the fuller CPU. perf sched, W=4 on 2 cores, each call of a 64 MiB all_reduce matched to where its
// ranks ran: 29.5-31.6 ms for the calls run two and two, 38-56 for those run three and one; at W=8,
// 56.5-62 ms for most calls run four and four, 68-75 for those run mostly five and three. The
// scheduler evens the ranks out when a CPU goes idle (it pulls a runnable task over from the busier
// one), and a wait that yields for 1 ms (Note [Waiting with more ranks than cores]) keeps its CPU
// busy: with every call's output checked in full before the next (the checks and the barriers
// between the calls move the ranks), 18-40 calls of 43 at W=4 took the slow mode, against 5 of 43
// when every wait yielded for 100 us. So past a call's first phase, where the CPUs its peers last
// posted from are those they run the call on, a wait on a CPU that holds at least two fewer of the
// group's ranks than another (one rank moved over would even them out) yields for 100 us only, then
// sleeps: once every rank there waits, the CPU goes idle and the scheduler moves a rank onto it.
// Same runs, with and without: W=4, 4 slow calls of 43 against 21-37 (5 runs each); W=8, median
// 59.4-63.6 ms against 63.8-71.7 (3 runs each). Checking the last call only, W=8, median
// 59.8-61.6 ms against 60.4-66.6 and p95 66.5-73.2 against 76.4-82.9 (4 runs each). The first phase
// of a call, and with it every call of one phase, waits as before: the small calls' p95 beside a
// matmul step depends on ranks that do not sleep (Note [Waiting with more ranks than cores]).
// Beside that step (chorus-bench --step-matmul 256 --tail, 2 runs each) the 16 MiB all_gather's p95
// went from 22.6 ms to 15.5-16.4 and the all_reduce's from 10.9-13.4 to 8.3-9.0; the calls of 8 B
// and 1 KiB did not move beyond noise. Only where the group holds every rank on these cores (as
// Note [A rank alone beside busy cores]): on namespace hosts the other hosts' ranks may be what
// fills a CPU.
//
// Note [Ranks placed, not bound]: ranks that outnumber the cores run unbound (Note [A core for every
// rank]), where the scheduler puts them: at fork and exec, and wherever it wakes them from a wait.
// Every rank runs once in a call, so a CPU with three ranks of four changes hands three times a
// call, one with two twice. Pinned so, W=4 on 2 cores, rank 0's median barrier took 3.04-3.06 us
// among three, 1.88-2.08 as two and two (whichever the pairs), 2.12-2.17 alone beside three, 3.8-3.9
// with all four on one CPU; at W=8, four and four 4.1-4.2 us, five with rank 0 and three 7.4, six
// and two 8.8. Unpinned, bench/compare.py's W=4 barrier took about 1.9 or 3.0 us from run to run
// (and W=8's 4.1 or 7.1-7.3) on both sides: its 1000 barriers come in the first milliseconds of a
// job, before the balancer has evened the ranks out (runs of 2 million always met the fast group).
// So when a group is made (after its backend's rendezvous, whose waits end in wake-ups the
// scheduler places anew) and finds every rank on this kernel allowed the same CPUs (none bound),
// each rank moves itself once onto its share of them, consecutive ranks together,
// and is at once allowed all of them again: the scheduler starts from an even spread and stays
// free to move any rank (beside a busy process, away from it). Consecutive ranks, because a ring
// hands each rank's data to the next: round robin put every ring neighbour on the other CPU, and
// bench/compare.py's W=8 64 MiB all_reduce took 59.9 ms against 55.7 unplaced; in blocks 54.8-59.7
// against 56.0-58.9 (3 alternating runs). chorus-bench, 1000 barriers a run, W=4: 1.83-1.90 us in
// 10 of 10 alternating runs (round robin) against 8 of 10 unplaced, the other two 2.94-2.97; W=8,
// 4.1-4.5 us in 6 of 8 against 3 of 8 (what moved ranks in the other two was not traced; a rank
// that sleeps in a wait, after its yielding, is placed anew as it wakes). Placed in blocks,
// compare.py's W=4 barrier took 1.86-1.93 us in all three runs. CHORUS_BIND_TO=none leaves ranks
// where they are.
//
// Note [Keeping the ranks even]: placed, the ranks still move (Note [Ranks placed, not bound]): a rank
// that sleeps in a long wait is placed anew as it wakes, and once the spread is uneven, ranks that
// yield keep both CPUs busy and the scheduler's balancer rarely moves one back within a
// measurement. Calls of one phase never reach Note [Evening out a long call], and an uneven spread
// costs them most: bench/compare.py's W=8 8-byte broadcast, timed after its 1 MiB all_gather, took
// 0.19-0.24 us in the runs where rank 0 (the root) shared its CPU with 4 or 5 other ranks, 0.06-0.10
// in the others (Open MPI 0.16-0.18; 16 runs unplaced, each rank's CPU printed). So a crowded group
// whose ranks all run on these cores checks every kEvenEvery (128) calls, at a call's start, how its
// ranks spread over the CPUs by where each last posted from, and where one CPU holds at least two
// more of them than another, each rank off its place moves onto it (and is free to run anywhere
// again at once). Ranks started six and two instead of four and four (rank 0 among the six; a
// scratch build), W=8, 8 alternating runs with and without: barrier median 4.0-4.2 us against
// 7.3-9.4, 8-byte broadcast 0.06-0.08 against 0.19-0.22. Started as placed, ranks moved 0 or 1
// times in a run of compare.py's sizes up to 1 MiB.
// A rank's place is its share of the CPUs by its rank in the group, as place_in_blocks counts it: in
// the group that placed it, the CPU it was placed on; in a job that recovers in process with its
// ranks renumbered (chorus/elastic.h), its share by its new rank, where its first placement
// (place_once places a process once) would not spread the survivors evenly. Any group's places
// spread its ranks evenly, so two groups of the same ranks in different orders do not undo each
// other's moves: the second finds them even.
// Beside a CPU-bound process the scheduler keeps ranks off its CPU on purpose, and moving them back
// every 128 calls fought it: 50-150 moves per rank a run, and W=8's p95s went up (barrier 17.8 and
// 48 us against 12.6 and 17.5 without). So no rank moves while more threads are runnable on this
// kernel than the group has ranks (/proc/loadavg, read only where a rank would move), and a check
// that finds the ranks uneven puts the next one twice as far off, up to kEvenEveryMost (1024
// times), one that finds them even starting over. Ranks asleep in a wait are not runnable, so a rank
// may still move beside the process while some sleep; W=4's small calls there took what they took
// before (5 alternating runs against b72ece4, median / p95: barrier 4.12 / 7.89 us against
// 4.14 / 6.99, 8-byte all_reduce 4.37 / 6.93 against 4.37 / 7.63). On a machine whose other CPUs
// run other jobs' threads the count is seldom that low, and ranks seldom move there either.
// CHORUS_BIND_TO=none, which leaves the ranks unplaced, leaves them unmoved too.
//
// Note [Light posts]: a sleeper and a poster meet like Dekker's pair: the sleeper counts itself
// in `waiters` and then reads the word, the poster writes the word and then reads `waiters`, and
// each needs its write seen before its read, or the poster wakes nobody while the sleeper sleeps
// on a word that has changed (until its futex times out, 20 ms). The sleeper's side is rare (after
// 1 ms of yielding at least), the poster's is every phase of every call, and the fence a
// seq_cst store makes it pay waits for its line to come back from the peer that reads it: 50-60 ns
// of every small call at W=2 here (barrier 0.36 -> 0.30 us without it). So where the kernel offers
// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) to every rank of a group, the posters store and read
// without a fence, and a sleeper, after counting itself in, forces a full barrier on every CPU
// running a registered process: either the poster's word is visible to the sleeper's read after
// it, or the poster's read of `waiters` comes after it and sees the sleeper. A group where some rank
// cannot register (an old kernel, a seccomp filter) keeps the fenced store everywhere.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "call.h"

namespace chorus::shm {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);

// Registers this process for membarrier's global expedited barrier; whether it can take part in
// light posts (Note [Light posts]).
bool asymmetric_fences();
// After a sleeper counted itself in: the barrier light posts pair with (Note [Light posts]).
void sleeper_fence();

// Publishes value in word and wakes sleepers (Note [Waiting with more ranks than cores]). `light`
// only where every process that may sleep on word has asymmetric_fences() (Note [Light posts]).
inline void post(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters, uint32_t value, bool light = false) {
  if (light) {
    word.store(value, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the read after the store
    if (waiters.load(std::memory_order_relaxed) != 0) futex_wake_all(&word);
    return;
  }
  word.store(value, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&word);
}

// a >= b for counters that wrap.
inline bool reached(uint32_t a, uint32_t b) { return int32_t(a - b) >= 0; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The CPUs this process may run on.
int usable_cores();

// The CPUs this process may run on, in increasing order (none if the kernel will not say).
std::vector<int> usable_cpus();

// This process's CPUs as ranges ("0-3,8"), and such a list back as CPU numbers.
std::string usable_cpu_list();
std::vector<int> parse_cpu_list(const std::string& list);

// Note [Ranks sharing the cores]: `ranks` of this job run on this machine's kernel, and `cpus` CPUs
// between them (a group saw them); the most noted of each counts.
void note_ranks_sharing_cores(int ranks, int cpus);

// CHORUS_BIND_TO as set, or "cores" where unset (Note [A core for every rank]: the launcher
// checks it; "none" also turns off Note [Ranks placed, not bound]).
std::string bind_to();

// Note [Ranks placed, not bound]: moves this thread, the index-th of `ranks` that may use the same
// CPUs, onto its share of them (ranks in order, consecutive ranks together), then lets it run on
// all of them again, where the scheduler leaves it until it balances otherwise. The CPU it moved
// onto; -1 where it has one CPU, the kernel refused, or CHORUS_BIND_TO=none. place_once does it the
// first time it is called in this process only. share_of_cpus is that share, of `cpus` (-1: none).
int place_in_blocks(int index, int ranks);
int share_of_cpus(const std::vector<int>& cpus, int index, int ranks);
void place_once(int index, int ranks);

// Whether place_once moved this process: its ranks may be moved (Note [Keeping the ranks even]).
bool placed();

// How many threads of this kernel are runnable now, this one included (-1: it will not say).
int runnable_now();

// Moves this thread onto `cpu`, then lets it run on the CPUs it had again: the CPU it moved onto, or
// -1 where it has one CPU, `cpu` is not one of them, or the kernel refused.
int move_onto(int cpu);

// The CPUs the ranks of this job on this kernel may use between them: the most a group has noted,
// at least this process's own.
int job_cores();

struct SpinPolicy {
  Clock::duration spin_for = std::chrono::microseconds(50);
  Clock::duration yield_for = std::chrono::microseconds(2000);
  // How long a wait yields when ranks outnumber cores (Note [Waiting with more ranks than cores]).
  static constexpr std::chrono::microseconds kCrowdedYield{1000};
  // How long a wait yields, crowded, on a CPU that holds fewer of the group's ranks than another
  // (Note [Evening out a long call]).
  static constexpr std::chrono::microseconds kEvenOutYield{100};
  // More ranks than cores: a wait spins only where no rank of its group shares its CPU, and only if
  // the group holds every rank on these cores (Note [A rank alone beside busy cores]).
  bool crowded = false, spin_alone = false;
  // Reads CHORUS_SHM_SPIN_US, the usable core count and the ranks sharing them (at least `size`).
  static SpinPolicy for_group(int size);
  // This policy for a wait on a CPU that holds fewer of the group's ranks than another: crowded, it
  // yields for kEvenOutYield only (Note [Evening out a long call]).
  SpinPolicy to_even_out() const;
};

// Whether a rank that last posted from `peer_cpu` did so from the CPU this rank runs on.
inline bool ran_here(const std::atomic<int32_t>& peer_cpu) {
  return peer_cpu.load(std::memory_order_relaxed) == sched_getcpu();
}

// Whether a wait on a rank that last posted from `peer_cpu` may spin: not if that was this CPU.
inline bool may_spin(const std::atomic<int32_t>& peer_cpu) { return !ran_here(peer_cpu); }

// Waits until ready(). `word` is the futex word whose change makes ready() true, `waiters` its
// sleepers count. Spins only if `spin` (may_spin). check() runs about every millisecond once
// spinning is over; it throws to end the wait (deadline passed, peer dead or aborted).
template <class Ready, class Check>
void wait_until(Ready&& ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters, const SpinPolicy& policy,
                bool spin, Check&& check) {
  // The first rounds react at once; a wait that may not spin yields after 4 (Note [Waiting with more
  // ranks than cores]).
  for (int i = 0; i < (spin ? 64 : 4); ++i)
    if (ready()) return;
  if (spin && policy.spin_for > Clock::duration::zero()) {
    const auto spin_until = Clock::now() + policy.spin_for;
    do {
      for (int i = 0; i < 16; ++i) {  // then go easy on the sibling
        if (ready()) return;
        cpu_relax();
      }
    } while (Clock::now() < spin_until);
  }
  const auto yield_until = Clock::now() + policy.yield_for;
  auto next_check = Clock::now() + std::chrono::milliseconds(1);
  while (true) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return;
      sched_yield();
    }
    auto now = Clock::now();
    if (now >= next_check) {
      check();
      next_check = now + std::chrono::milliseconds(1);
    }
    if (now >= yield_until) break;
  }
  while (true) {
    uint32_t seen = word.load(std::memory_order_seq_cst);
    waiters.fetch_add(1, std::memory_order_seq_cst);
    sleeper_fence();
    if (ready()) {
      waiters.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    futex_wait(&word, seen, std::chrono::milliseconds(20));
    waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    check();
  }
}

}  // namespace chorus::shm
