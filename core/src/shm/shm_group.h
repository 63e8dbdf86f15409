// The phase engine every shared-memory algorithm is written in.
//
// Note [Phases]: a call is a sequence of phases. In each phase a rank writes what its peers
// need into its own slot (write_slot()), then sync() posts the phase number in its control
// line and waits until every rank has posted it; after that the rank reads its peers' slots of
// that phase (read_slot()). Slots alternate by phase parity, so a rank writes phase n+1 while
// slower peers still read phase n, and it cannot lap them: it only gets past phase n+1 when all
// of them have finished reading phase n. Every rank runs the same phases in the same order, so
// the phase counters agree without ever being exchanged. (A broadcast of many chunks leaves this
// lockstep after its first phase, and returns to it at its last: Note [Broadcast through every slot].)
//
// Note [Owed waits]: a rank that reads nothing after a call's last phase (a broadcast's or a
// scatter's root, the ranks a gather or a reduce does not deliver to) posts that phase and
// returns without waiting for it: its data is in its slot or its call line, so its caller may
// reuse its buffer at once, as an MPI root does. The wait is owed, and start() pays it before
// the next call writes anything: that call's first slot is the one the peers may still be
// reading. A peer that fails in between is reported by that next call, naming the call it
// failed in. When no call comes, finish() pays it: Communicator::shutdown raises what it finds,
// and the communicator's destructor logs it, each waiting a bounded time. W=4 on 2 cores, 1 MiB broadcast: the root took 145-152 us, waiting for three ranks
// that share its core to copy the first half out; 94-98 us owing the wait (Open MPI 94-100).
//
// A call of a single phase (a message in the call line or in one slot) has not been compared
// when such a rank leaves it, so the payment compares it too (Note [Comparing calls]). Different
// calls then raise CollectiveMismatch at this rank's next call on the group, naming the one
// they differ in, as every later call of an aborted communicator would. If a peer rejected its
// arguments, this rank's next call is refused on every rank, saying which call was rejected and
// why: the others must not wait for a call this rank will not make, and the group goes on. An
// 8-byte broadcast's root took 0.28 us at W=2 and 3.8 us at W=4 on 2 cores, where it waited for
// every rank to arrive; 0.13 and 0.18 us leaving (Open MPI 0.11 and 0.15).
//
// Note [Comparing calls] (call_compare.h) on shared memory: before its first sync a call publishes its
// descriptor and counts in the call line of its parity, and the first sync runs compare_calls on
// every rank's before anyone reads data.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "abort_cause.h"
#include "backend.h"
#include "shm/peer_read.h"
#include "shm/peer_watch.h"
#include "shm/segment.h"
#include "shm/slot_stores.h"
#include "shm/symmetric.h"
#include "shm/waiter.h"

namespace chorus::shm {

class ShmGroup {
 public:
  ShmGroup(Store& store, int rank, int world, const BackendOptions& options);
  ~ShmGroup();  // tells peers this rank left

  int rank() const { return rank_; }
  int world() const { return world_; }
  // A slot holds slot_bytes(): chunk_bytes() or, with more ranks than cores, a few chunks (Note
  // [Deep slots when ranks share cores]). Calls go in rounds of one or the other.
  size_t slot_bytes() const { return seg_.layout().slot_bytes; }
  size_t chunk_bytes() const { return seg_.layout().chunk_bytes; }
  // Rank 0's job_cores(): the same on every rank, so every rank picks the same algorithm.
  int cores() { return int(seg_.header().cores); }
  const std::string& name() const { return name_; }
  Segment& segment() { return seg_; }

  // Begins a call (Note [Comparing calls]): publishes its descriptor and counts.
  // Collectives only, one at a time. A call this rank found invalid ends here: the first phase
  // raises InvalidArgument on every rank.
  void start(const Call& call);
  // The current call's inline payload of this rank / of rank r (kInlineBytes).
  uint8_t* my_inline() { return seg_.ctrl(rank_).calls[call_ & 1].data; }
  const uint8_t* inline_of(int r) { return seg_.ctrl(r).calls[call_ & 1].data; }
  // The counts rank r published for the current call.
  const uint64_t* counts_of(int r) { return seg_.counts(r, call_); }

  // Posts the next phase and waits for every rank to post it (Note [Phases]).
  void sync() {
    post();
    wait();
  }
  // The two halves of sync(), for work that needs neither the peers' data nor a free slot (a
  // rank's own block): post, do it, then wait.
  void post();
  void wait();
  // Waits until every other rank has posted phase `target` (compares the call, as wait() does), or
  // only rank `r`: for calls whose ranks post at their own pace (Note [Broadcast through every slot]).
  void wait_all(uint32_t target);
  void wait_rank(int r, uint32_t target);
  // Whether every other rank has posted phase `target` (and none gave up on the call), without
  // waiting: what wait_all(target) would return at once for.
  bool all_reached(uint32_t target);
  // Hands this rank's CPU over once if rank r has not posted phase `target` yet and last posted from
  // this CPU: r then, unless it sleeps, waits for this CPU (Note [The root first]). Never blocks.
  void yield_to(int r, uint32_t target);
  uint32_t phase() const { return phase_; }  // the last phase this rank posted
  // The call's last phase on a rank that reads nothing after it: posts it and leaves the wait,
  // and the comparison of a call of one phase, to the next call (Note [Owed waits]).
  void post_last();
  // Pays what this rank still owes its last call, waiting until `deadline` at most: when there is
  // no next call (the group is shut down or destroyed). Throws as wait() does.
  void finish(Clock::time_point deadline);
  uint8_t* write_slot() { return seg_.slot(rank_, phase_ + 1); }
  // Every rank's slots as one ring (Note [Broadcast through every slot]): slot j of slot_count(),
  // and the index in it of rank r's write_slot() (the phases agree between calls).
  size_t slot_count() const { return 2 * size_t(world_); }
  uint8_t* slot_at(size_t j) { return seg_.slot(int(j / 2), uint32_t(j % 2)); }
  size_t write_slot_index(int r) const { return 2 * size_t(r) + ((phase_ + 1) & 1); }
  const uint8_t* read_slot(int r) { return seg_.slot(r, phase_); }
  // Note [A staging area for large broadcasts]: reserve_stage() before the call's first post (it
  // does something on rank 0 only), stage_ready() after its first sync.
  void reserve_stage() {
    if (rank_ == 0) seg_.reserve_stage();
  }
  bool stage_ready() { return seg_.stage_ready(); }
  uint8_t* stage() { return seg_.stage(); }
  size_t stage_bytes() const { return seg_.layout().stage_bytes; }

  // Whether a wait on `peer` (on any peer: -1) may spin before it yields (Note [Waiting with more
  // ranks than cores], Note [A rank alone beside busy cores]).
  bool may_spin_for(int peer);
  // Whether this rank runs on a CPU that holds at least two fewer of the group's ranks than
  // another, by the CPUs they last posted from (Note [Evening out a long call]).
  bool on_emptier_cpu();
  // Note [Keeping the ranks even]: whether, by the CPUs they last posted from, the group's ranks are
  // spread unevenly over the CPUs (one holds at least two more than another); this rank's place, its
  // share of the CPUs as place_in_blocks counts it by its rank in the group; and, where the ranks are
  // spread unevenly and this process was placed (place_once) but this rank runs off its place, a
  // move onto it, unless more threads are runnable than the group has ranks (`runnable`: how many
  // are now): whether it moved.
  // Crowded, a call's start does it every kEvenEvery calls, and twice as far apart after each check
  // that finds them uneven, up to kEvenEveryMost: where the scheduler keeps them so, it has a reason.
  bool spread_unevenly();
  int place() const;
  bool keep_even(int (*runnable)() = runnable_now);
  uint64_t next_even_check() const { return next_even_; }  // the call whose start checks next
  static constexpr uint64_t kEvenEvery = 128, kEvenEveryMost = kEvenEvery << 10;

  // Waits until ready() for point-to-point call `c` with `peer`; `word` changes when ready()
  // may have become true. Throws like sync() does. Thread-safe: sends and receives on different
  // channels may wait at the same time as each other and as a collective.
  template <class Ready, class What>
  void wait_for_peer(Ready&& ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters, int peer,
                     const Call& c, What&& what) {
    if (ready()) return;  // the vector of peers is built only when a wait checks on them
    wait_until(ready, word, waiters, policy_, may_spin_for(peer),
               [&] { check_peers({peer}, what(), c.start, c.deadline, [&](int) { return !ready(); }); });
  }
  // The same, for a call that waits on any of `peers` (a receive from any rank).
  template <class Ready, class What>
  void wait_for_peers(Ready&& ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters,
                      const std::vector<int>& peers, const Call& c, What&& what) {
    if (ready()) return;
    wait_until(ready, word, waiters, policy_, may_spin_for(-1),
               [&] { check_peers(peers, what(), c.start, c.deadline, [&](int) { return !ready(); }); });
  }

  // Single copies (Note [Single-copy collectives]). Whether a call of `kind` moving `bytes` per
  // rank may write into its peers' buffers; the same answer on every rank.
  bool single_copy(OpKind kind, size_t bytes) {
    return single_copy_on_ && single_copy_window(kind, world_, int(seg_.header().cores)).contains(bytes);
  }
  bool reads_peers() const { return reads_peers_; }     // this rank's verdict from the probe
  void stop_single_copy() { single_copy_on_ = false; }  // every rank calls it at the same call
  int pid_of(int r) { return seg_.ctrl(r).pid.load(std::memory_order_relaxed); }

  // The way of a staged call moving `bytes` per rank (Note [Streaming into the slots]): how it
  // writes into the slots and copies out, or whether it reads its peers instead (`other`). The
  // way of a call was chosen by rank 0 in the last call of the same kind and size class, and is
  // the same on every rank that learned it. slot_stores() before the call's first store or sync:
  // rank 0 chooses the way of the next such call and publishes it. learn_slot_stores() after the
  // first sync; slot_stores_done() after the last phase, where rank 0 times the call.
  SlotStores slot_stores(OpKind kind, size_t bytes, OtherWays other = {});
  void learn_slot_stores(const SlotStores& s);
  void slot_stores_done(const SlotStores& s, size_t bytes);

  // Publishes this rank's failure so peers stop waiting for it.
  void abort(const AbortCause& cause);

  // Symmetric memory (Note [Symmetric buffers]). Allocations are counted the same on every rank.
  uint32_t next_symmetric_id() { return ++symmetric_made_; }
  uint32_t symmetric_made() const { return symmetric_made_; }
  const std::shared_ptr<SymmetricRegistry>& symmetric() const { return symmetric_; }

 private:
  void compare();                            // Note [Comparing calls] on every rank's published call
  void wait_for(uint32_t target, int only);  // wait_all (only < 0) and wait_rank
  bool posted(int p, uint32_t target);       // whether peer p posted phase `target` of this call
  // Counts the group's ranks on each CPU into ranks_on_cpu_ (which the caller clears) by the CPU
  // each last posted from, this rank's as `here`: the most on one CPU.
  int count_ranks_on_cpus(int32_t here);
  // Throws if the deadline passed, a peer in `awaited` died or left, or any peer aborted. A peer
  // that died or left is named only while still_waiting(peer) (when given) says this rank still
  // waits for it: it may have done its part just before it went (Note [Done, then gone]).
  void check_peers(const std::vector<int>& awaited, const std::string& what, Clock::time_point started,
                   Clock::time_point deadline, const std::function<bool(int)>& still_waiting = {});
  std::string call_name();  // "all_reduce(f32 x 8, sum) (call #12)", built only for messages
  std::string current();    // the current call as its descriptor says
  bool probe_peer_reads();  // Note [Single-copy collectives]

  int rank_, world_;
  std::string name_;
  BackendOptions named_;  // name_rank(): how messages name a peer
  Segment seg_;
  SpinPolicy policy_;
  SpinPolicy even_out_policy_;                                 // Note [Evening out a long call]
  std::vector<int> ranks_on_cpu_;                              // count_ranks_on_cpus(), by CPU
  std::vector<int> cpus_;                                      // the CPUs this rank may use, as the group was made
  uint64_t even_every_ = kEvenEvery, next_even_ = kEvenEvery;  // Note [Keeping the ranks even]
  PeerWatch watch_;
  uint32_t phase_ = 0;        // last phase this rank posted
  uint32_t first_phase_ = 0;  // phase_ when the current call started
  uint64_t call_ = 0;         // index of the current call
  bool light_posts_ = false;  // Note [Light posts]
  bool owed_ = false;         // the last call's last wait is still to be done (Note [Owed waits])
  bool compared_ = true;      // the current call's descriptors were compared
  // Copies of what this rank stored into its lines, read back from here (Note [Migrating lines]).
  CallDesc desc_{};              // the current call's descriptor
  int32_t cpu_ = -1;             // the CPU this rank last posted from
  std::vector<RankCall> calls_;  // compare()'s view of every rank's call, kept between calls
  uint32_t symmetric_made_ = 0;
  bool reads_peers_ = false;
  bool single_copy_on_ = false;     // rank 0's setting (Header::single_copy) allows them, until a call turns them off
  bool single_copy_timed_ = false;  // rank 0 times them against the slots (kSingleCopyTimed)
  std::shared_ptr<SymmetricRegistry> symmetric_ = std::make_shared<SymmetricRegistry>();
  std::optional<bool> stream_slots_;            // the setting: always / never; nullopt: choose
  std::array<WayChoice, kChoices> way_choice_;  // rank 0's, by choice_index()
  std::array<Way, kChoices> planned_{};         // the way of the next call, by choice_index()
  std::array<double, kChoices> stream_pace_{};  // SlotStores::stream_pace, by choice_index()
  // Rank 0's kLineNextWay bits as it last stored them into each of its two call lines (Note [Timing
  // a few calls]); none at first.
  uint32_t published_way_[2] = {~0u, ~0u};
  Clock::time_point started_, deadline_;
};

}  // namespace chorus::shm
