#include "shm/shm_group.h"

#include <algorithm>
#include <cstring>

#include "chorus/core/error.h"

namespace chorus::shm {

ShmGroup::ShmGroup(Store& store, int rank, int world, const BackendOptions& options)
    : rank_(rank),
      world_(world),
      name_(options.group_name),
      named_(options),
      seg_(store, rank, world, options.shm.chunk_bytes, options.shm.stage_bytes.value_or(0),
           !options.shm.single_copy   ? kSingleCopyTimed
           : *options.shm.single_copy ? kSingleCopyAlways
                                      : kSingleCopyNever,
           options.deadline, options.group_name),
      policy_(SpinPolicy::for_group(world)),
      even_out_policy_(policy_.to_even_out()),
      cpus_(usable_cpus()),
      calls_(size_t(world)),
      stream_slots_(options.shm.stream_slots) {
  seg_.ctrl(rank_).cpu.store(cpu_ = sched_getcpu());  // else it reads 0 (CPU 0) until the first post()
  if (!policy_.crowded || !policy_.spin_alone) next_even_ = UINT64_MAX;  // Note [Keeping the ranks even]
  light_posts_ = true;  // Note [Light posts]: only if every rank can pair them
  for (int r = 0; r < world; ++r) light_posts_ = light_posts_ && seg_.ctrl(r).fences.load() == 1;
  for (int r = 0; r < world; ++r)
    if (r != rank) watch_.watch(r, seg_.ctrl(r).pid.load());
  // Only a group that tries single copies needs to know (rank 0 decided: Note [Single-copy collectives]).
  single_copy_on_ = seg_.header().single_copy != kSingleCopyNever;
  single_copy_timed_ = seg_.header().single_copy == kSingleCopyTimed;
  reads_peers_ = single_copy_on_ && options.shm.single_copy.value_or(true) && probe_peer_reads();
}

bool ShmGroup::probe_peer_reads() {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    RankControl& peer = seg_.ctrl(r);
    const uint64_t where = peer.mapped_at.load() + (reinterpret_cast<uint8_t*>(&peer.probe_word) - seg_.base());
    uint64_t word = 0;
    if (!read_peer(peer.pid.load(), reinterpret_cast<const void*>(where), &word, sizeof(word)) ||
        word != peer.probe_word.load())
      return false;
  }
  return true;
}

ShmGroup::~ShmGroup() {
  RankControl& me = seg_.ctrl(rank_);
  if (me.state.load() == kActive) me.state.store(kLeft);
  futex_wake_all(&me.seq);
}

std::string ShmGroup::current() {
  return describe(OpKind(desc_.kind), DataType(desc_.dtype), ReduceOp(desc_.op), desc_.root, desc_.count);
}

std::string ShmGroup::call_name() { return detail::concat(current(), " (call #", call_, ")"); }

void ShmGroup::start(const Call& call) {
  std::string refused;  // why this call is refused on every rank: the last one was
  if (owed_) {          // Note [Owed waits]: the last call's, named as its own if a peer failed in it
    owed_ = false;
    try {
      wait();  // compares the last call if it had a single phase
    } catch (const InvalidArgument& e) {
      refused = detail::concat("call #", call_, ", which rank ", rank_, " had left early, was rejected: ", e.what());
    }
  }
  ++call_;
  first_phase_ = phase_;
  if (call_ >= next_even_) keep_even();  // Note [Keeping the ranks even]
  RankControl& me = seg_.ctrl(rank_);
  const std::string& invalid = refused.empty() ? call.invalid : refused;
  CallDesc d = make_desc(call, call_);
  d.invalid = invalid.empty() ? 0 : 1;
  if (has_counts(call.kind)) {
    uint64_t* counts = seg_.counts(rank_, call_);
    std::copy(call.counts.begin(), call.counts.end(), counts);
    std::copy(call.recv_counts.begin(), call.recv_counts.end(), counts + world_);
  }
  if (d.invalid) put_text(me.invalid_text[call_ & 1], invalid);
  me.calls[call_ & 1].desc = d;
  desc_ = d;
  compared_ = false;
  started_ = call.start;
  deadline_ = call.deadline;
  if (d.invalid) {
    sync();  // raises InvalidArgument here and on every other rank
    throw InvalidArgument(invalid);
  }
}

SlotStores ShmGroup::slot_stores(OpKind kind, size_t bytes, OtherWays other) {
  static_assert(size_t(OpKind::RecvAny) < 32);
  SlotStores s;
  s.large = world_ > 1 && bytes >= WayChoice::kMinBytes;
  if (!s.large) return s;
  s.choice = choice_index(kind, bytes);
  // Whether this call may reach its peers' buffers is the same on every rank, and so is its way.
  const bool reads = other.read_peers && single_copy(kind, bytes);
  // Streaming copies out are a way of their own only where nothing fixes the stores.
  const bool out_way = other.stream_out && bytes >= kStreamMinBytes && !stream_slots_;
  unsigned allowed = way_bit(Way::kSingleCopy);
  if (!reads || single_copy_timed_)
    allowed = (reads ? way_bit(Way::kSingleCopy) : 0u) | (stream_slots_ != true ? way_bit(Way::kNormal) : 0u) |
              (stream_slots_ != false ? way_bit(Way::kStream) : 0u) |
              (out_way ? way_bit(Way::kStreamOut) | way_bit(Way::kStreamBoth) : 0u);
  s.way = planned_[s.choice];
  if (allowed == way_bit(Way::kSingleCopy))
    s.way = Way::kSingleCopy;  // rank 0's setting says so
  else if ((s.way == Way::kSingleCopy && !reads) || (s.way == Way::kStreamOut && !out_way))
    s.way = Way::kNormal;  // single copies were stopped, on every rank at the same call; or, by a
                           // size of the same class, or in place, this call copies out no other way
  else if (s.way == Way::kStreamBoth && !out_way)
    s.way = Way::kStream;  // the same, keeping its streaming stores into the slots
  if (rank_ == 0 && !(allowed & way_bit(s.way))) s.way = Way(__builtin_ctz(allowed));  // rank 0's setting of the stores
  if (!stream_slots_) s.stream_pace = &stream_pace_[s.choice];  // Note [Falling back within a call]
  if (rank_ != 0) return s;
  WayChoice& choice = way_choice_[s.choice];
  const Way next = choice.choose(allowed, bytes);
  planned_[s.choice] = next;
  // Stored only where it changed (Note [Timing a few calls]); the first post publishes it.
  const uint32_t way_bits = uint32_t(next) << kLineWayShift;
  if (published_way_[call_ & 1] != way_bits) {
    std::atomic<uint32_t>& flags = seg_.ctrl(0).calls[call_ & 1].flags;
    flags.store((flags.load(std::memory_order_relaxed) & ~uint32_t(kLineNextWay)) | way_bits,
                std::memory_order_relaxed);
    published_way_[call_ & 1] = way_bits;
  }
  if (__builtin_popcount(allowed) > 1 && choice.timing()) s.started = ticks();  // measuring: nothing fixes the way
  return s;
}

void ShmGroup::learn_slot_stores(const SlotStores& s) {
  if (!s.large || rank_ == 0) return;
  const uint32_t flags = seg_.ctrl(0).calls[call_ & 1].flags.load(std::memory_order_relaxed);
  planned_[s.choice] = Way((flags & kLineNextWay) >> kLineWayShift);
}

void ShmGroup::slot_stores_done(const SlotStores& s, size_t bytes) {
  if (!s.large || s.started == 0) return;  // untimed: not rank 0, or not measuring
  way_choice_[s.choice].took(s.way, (double(ticks() - s.started) + s.owed) / double(bytes));
}

void ShmGroup::post() {
  RankControl& me = seg_.ctrl(rank_);
  const uint32_t target = ++phase_;
  me.calls[call_ & 1].phase.store(target, std::memory_order_release);  // Note [One line per call]
  // Note [Publish the phase first]: a waiting peer reads this rank's cpu (to decide whether to
  // spin), so a store to it must first take its line back from the peer, and x86 makes stores
  // visible in program order. A cpu store ahead of the phase store delayed every release of a
  // waiting peer by that extra line transfer (W=2 here: barrier 0.42 -> 0.33 us, 8-byte all_reduce
  // 0.42 -> 0.35 once moved). So the phase goes first, cpu is written only when it changed, and
  // seq (the futex word, in the control line, which sleepers read) last.
  const int32_t cpu = sched_getcpu();
  if (cpu_ != cpu) me.cpu.store(cpu_ = cpu, std::memory_order_relaxed);
  shm::post(me.seq, me.waiters, target, light_posts_);
}

void ShmGroup::finish(Clock::time_point deadline) {
  if (!owed_) return;
  owed_ = false;
  deadline_ = deadline;
  wait();  // compares the last call if it had a single phase
}

void ShmGroup::post_last() {
  post();
  owed_ = true;
}

void ShmGroup::wait() { wait_for(phase_, -1); }
void ShmGroup::wait_all(uint32_t target) { wait_for(target, -1); }
void ShmGroup::wait_rank(int r, uint32_t target) { wait_for(target, r); }

void ShmGroup::wait_for(uint32_t target, int only) {
  const size_t line = call_ & 1;
  // Crowded, the answer is the same for every peer and reads every peer's cpu: once per
  // wait, at its first peer not yet there (Note [A rank alone beside busy cores]).
  int alone = -1, uneven = -1;
  auto spin = [&](int p) {
    if (!policy_.crowded) return may_spin_for(p);
    if (alone < 0) alone = may_spin_for(-1);
    return alone == 1;
  };
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || (only >= 0 && p != only)) continue;
    RankControl& peer = seg_.ctrl(p);
    auto ready = [&] { return posted(p, target); };
    if (!ready()) {
      const bool spins = spin(p);
      // Note [Evening out a long call]: past the call's first phase, the CPUs the peers posted from are this call's.
      if (uneven < 0) uneven = policy_.crowded && policy_.spin_alone && target - first_phase_ > 1 && on_emptier_cpu();
      wait_until(ready, peer.seq, peer.waiters, uneven ? even_out_policy_ : policy_, spins, [&] {
        std::vector<int> missing;
        for (int q = 0; q < world_; ++q)
          if (q != rank_ && (only < 0 || q == only) && !posted(q, target)) missing.push_back(q);
        check_peers(missing, call_name(), started_, deadline_, [&](int q) { return !posted(q, target); });
      });
    }
    // Note [Aborted in the call line]: the peer posted, but may have given up on this call since.
    if (peer.calls[line].flags.load(std::memory_order_acquire) & kLineAborted)
      check_peers({}, call_name(), started_, deadline_);
  }
  if (!compared_ && only < 0) {
    compared_ = true;
    compare();
  }
}

bool ShmGroup::may_spin_for(int peer) {
  if (!policy_.crowded) return peer < 0 || may_spin(seg_.ctrl(peer).cpu);
  if (!policy_.spin_alone) return false;  // Note [A rank alone beside busy cores]
  const int32_t cpu = sched_getcpu();
  for (int q = 0; q < world_; ++q)
    if (q != rank_ && seg_.ctrl(q).cpu.load(std::memory_order_relaxed) == cpu) return false;
  return true;
}

int ShmGroup::count_ranks_on_cpus(int32_t here) {
  int most = 0;
  for (int q = 0; q < world_; ++q) {
    const int32_t c = q == rank_ ? here : seg_.ctrl(q).cpu.load(std::memory_order_relaxed);
    if (c < 0) continue;
    if (size_t(c) >= ranks_on_cpu_.size()) ranks_on_cpu_.resize(size_t(c) + 1, 0);
    most = std::max(most, ++ranks_on_cpu_[size_t(c)]);
  }
  return most;
}

bool ShmGroup::on_emptier_cpu() {
  const int32_t here = sched_getcpu();
  const int most = count_ranks_on_cpus(here);
  const int mine = here < 0 ? most : ranks_on_cpu_[size_t(here)];
  std::fill(ranks_on_cpu_.begin(), ranks_on_cpu_.end(), 0);
  return most >= mine + 2;
}

bool ShmGroup::spread_unevenly() {
  const int most = count_ranks_on_cpus(sched_getcpu());
  int least = most;
  for (int c : cpus_) least = std::min(least, size_t(c) < ranks_on_cpu_.size() ? ranks_on_cpu_[size_t(c)] : 0);
  std::fill(ranks_on_cpu_.begin(), ranks_on_cpu_.end(), 0);
  return most >= least + 2;
}

int ShmGroup::place() const { return share_of_cpus(cpus_, rank_, world_); }

bool ShmGroup::keep_even(int (*runnable)()) {
  if (!placed()) {  // never placed, never moved
    next_even_ = UINT64_MAX;
    return false;
  }
  const bool uneven = spread_unevenly();
  even_every_ = uneven ? std::min(2 * even_every_, kEvenEveryMost) : kEvenEvery;
  next_even_ = call_ + even_every_;
  // Only while nothing but the group's ranks wants the CPUs: beside a busy process the scheduler keeps
  // ranks off its CPU for a reason.
  return uneven && sched_getcpu() != place() && runnable() <= world_ && move_onto(place()) >= 0;
}

bool ShmGroup::posted(int p, uint32_t target) {
  return reached(seg_.ctrl(p).calls[call_ & 1].phase.load(std::memory_order_acquire), target);
}

bool ShmGroup::all_reached(uint32_t target) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    if (!posted(p, target) || (seg_.ctrl(p).calls[call_ & 1].flags.load(std::memory_order_acquire) & kLineAborted))
      return false;
  }
  return true;
}

void ShmGroup::yield_to(int r, uint32_t target) {
  if (!posted(r, target) && ran_here(seg_.ctrl(r).cpu)) sched_yield();
}

void ShmGroup::compare() {
  // The common case first: every rank published the same descriptor (same call, kind, dtype, op,
  // root and count, none rejected), and no counts travel with it.
  // This rank's own from its copy (Note [Migrating lines]).
  bool same = !desc_.invalid && desc_.ncounts == 0;
  for (int p = 0; p < world_ && same; ++p)
    same = p == rank_ || std::memcmp(&seg_.ctrl(p).calls[call_ & 1].desc, &desc_, sizeof(CallDesc)) == 0;
  if (same) return;
  for (int p = 0; p < world_; ++p)
    calls_[size_t(p)] = {seg_.ctrl(p).calls[call_ & 1].desc, counts_of(p), seg_.ctrl(p).invalid_text[call_ & 1]};
  compare_calls(calls_, rank_, call_, name_);
}

// Note [Done, then gone]: a waiter lists the peers it still waits for, then reads their state. In
// between, a peer it found missing (or whose post it had not seen yet) may post, finish the call
// and leave the group or exit: with more ranks than cores the waiter can lose its core for
// milliseconds there. So before naming a peer that left or died, the waiter asks again whether it
// still waits for it; the peer's post is stored before its state, so a waiter that sees the state
// sees the post. Seen in CI once: four ranks on two cores, a barrier, and "rank 1 left" on rank 3
// though rank 1 had finished the barrier. And later "rank 0 died" on rank 1 in the same test: the
// waiter looked at whether the peer was alive twice, and a peer alive at the first look could
// post, finish and exit before the second, which named it without asking again. Each is read once.
void ShmGroup::check_peers(const std::vector<int>& awaited, const std::string& what, Clock::time_point started,
                           Clock::time_point deadline, const std::function<bool(int)>& still_waiting) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    RankControl& peer = seg_.ctrl(p);
    if (peer.state.load() != kAborted) continue;
    raise_peer_abort({AbortKind(peer.abort_kind.load()), peer.abort_rank.load(),
                      std::string(peer.abort_text, strnlen(peer.abort_text, kAbortTextBytes))},
                     p, what, name_);
  }
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  for (int p : awaited) {
    const bool left = seg_.ctrl(p).state.load() == kLeft, dead = !left && !watch_.alive(p);
    if ((left || dead) && still_waiting && !still_waiting(p)) continue;
    if (left)
      throw PeerFailure(
          detail::concat(named_.name_rank(p), " left group '", name_, "' (its communicator was destroyed) while rank ",
                         rank_, " waited for it in ", what, " after ", elapsed.count(), " ms"),
          p);
    if (dead)
      throw PeerFailure(
          detail::concat(named_.name_rank(p), ", pid ", seg_.ctrl(p).pid.load(), ", of group '", name_,
                         "' died while rank ", rank_, " waited for it in ", what, " after ", elapsed.count(), " ms"),
          p);
  }
  if (Clock::now() < deadline) return;
  std::string where;
  for (int p : awaited) {
    const RankControl& c = seg_.ctrl(p);
    const CallDesc& a = c.calls[0].desc;
    const CallDesc& b = c.calls[1].desc;
    const CallDesc& last = a.call > b.call ? a : b;
    if (last.call == 0)
      where += detail::concat("; rank ", p, " has made no call yet");
    else
      where +=
          detail::concat("; rank ", p, " is at call #", last.call, ": ",
                         describe(OpKind(last.kind), DataType(last.dtype), ReduceOp(last.op), last.root, last.count));
  }
  throw TimeoutError(
      detail::concat(what, " on group '", name_, "' timed out after ", elapsed.count(), " ms on rank ", rank_, ": rank",
                     awaited.size() > 1 ? "s " : " ", list_ranks(awaited), " did not arrive", where),
      awaited, what);
}

void ShmGroup::abort(const AbortCause& cause) {
  RankControl& me = seg_.ctrl(rank_);
  if (me.state.load() == kAborted) return;
  put_text(me.abort_text, cause.text, kAbortTextBytes);
  me.abort_kind.store(uint32_t(cause.kind));
  me.abort_rank.store(cause.about);
  me.state.store(kAborted);
  for (CallLine& line : me.calls) line.flags.fetch_or(kLineAborted);  // Note [Aborted in the call line]
  futex_wake_all(&me.seq);
}

}  // namespace chorus::shm
