#include "shm/slot_stores.h"

#include <algorithm>

namespace chorus::shm {

Way WayChoice::choose(unsigned allowed, size_t bytes) {
  timing_now_ = timing_next_;
  const Way next = decide(allowed, bytes);
  decided_run_.add(next);
  // Note [Timing a few calls]: steady where the way in use goes on past the calls a trial or a
  // change of way slows (the call back is timed for the trial's peak, the one after it counted),
  // and its cost is known; untimed_ then counts what the calls left untimed took, by that cost.
  const double in_use = cost(use_);
  const bool steady = settled_ && next == use_ && trial_left_ == 0 && !leaving_ &&
                      decided_run_.calls > decided_run_.uncounted_calls() + 1 && in_use > 0;
  untimed_ = steady ? untimed_ + in_use * double(bytes) : 0;
  timing_next_ = !steady || untimed_ >= kUntimedTicks;
  if (timing_next_) untimed_ = 0;
  return next;
}

Way WayChoice::decide(unsigned allowed, size_t bytes) {
  // Nothing to weigh before the next trial falls due, while the times stay as they are (took()).
  if (quiet_ && allowed == quiet_allowed_ && decided_ + 1 < quiet_until_) {
    ++decided_;
    return use_;
  }
  quiet_ = false;
  Way ways[kWays];
  size_t n = 0;
  for (int w = 0; w < kWays; ++w)
    if (allowed & way_bit(Way(w))) ways[n++] = Way(w);
  const uint64_t call = ++decided_;
  if (n <= 1) return use_ = n == 1 ? ways[0] : Way::kNormal;
  // Each way first for its uncounted calls and one counted; for messages that warm their buffers
  // over many calls, the first way for kWarmCalls more (Note [Streaming into the slots]).
  uint64_t first_calls = bytes < kWarmBelow ? kWarmCalls : 0;
  for (size_t i = 0; i < n; ++i)
    if (call <= (first_calls += uncounted(ways[i > 0 ? i - 1 : 0], ways[i]) + 1)) return ways[i];
  if (trial_left_ > 0 && (allowed & way_bit(tried_))) {  // a trial's calls after its first
    if (--trial_left_ == 0) {  // its counted call, whose time sets the next trial once it is in (took())
      next_try_[int(tried_)] = decided_ + kTryLeast;
      scheduled_[int(tried_)] = 0;
    }
    return tried_;
  }
  trial_left_ = 0;
  // The fastest way timed, of those weighed: the first choice is among the ways through the slots,
  // and the single copy is weighed from its first trial against the way in use on (Note [Streaming
  // into the slots]).
  if (!settled_) unweighed_ = allowed & way_bit(Way::kSingleCopy);
  Way best = ways[0];
  bool untimed = false;
  for (size_t i = 0; i < n; ++i) {
    untimed = untimed || cost(ways[i]) == 0;
    if (unweighed_ & way_bit(ways[i])) continue;
    if (cost(ways[i]) > 0 && (cost(best) == 0 || cost(ways[i]) < cost(best))) best = ways[i];
  }
  // Every allowed way has had its first calls, but the counted one of the last may not be timed yet (a
  // way is decided while the call before it runs): until it is, the fastest so far (ways[0] when
  // rank 0 timed none: it had no part in the calls).
  if (untimed) return use_ = best;
  // The way in use has its times from the last few calls; the others' come from trials spread
  // over many more, and the fastest of those is luckier: switch only on a clear difference. The
  // first time every way has a time, the fastest is taken as it is.
  bool take = !settled_ || !(allowed & way_bit(use_)) || cost(best) < kSwitchBelow * cost(use_);
  // A way left out of the first choice is weighed, at its first trial, as that choice weighed: by
  // the trial's time, taken where it is the faster.
  if (weigh_now_ != 0) {
    const Way w = Way(__builtin_ctz(weigh_now_));
    weigh_now_ = 0;
    if ((allowed & way_bit(w)) && latest(w) < cost(use_)) {
      best = w;
      take = true;
    }
  }
  if (take) {
    // The way left behind is tried again soon, loud or not: its last times may come from a slow
    // spell of the machine, which slows every way, and the way taken has older times.
    if (settled_ && best != use_) {
      next_try_[int(use_)] = decided_ + kTryClose;
      scheduled_[int(use_)] = 0;
      leaving_ = true;
      left_ = use_;
    }
    use_ = best;
  }
  settled_ = true;
  for (size_t i = 0; i < n; ++i) {
    const Way w = ways[i];
    if (w == use_) continue;
    if (next_try_[int(w)] == 0) schedule(w, decided_);
    // Due by the times it was set from: set again from the same call by the times as they are now.
    // The way in use's may have come down since, as its first calls warmed the buffers, and a way
    // then left further behind than it was is tried later (schedule()).
    if (next_try_[int(w)] <= decided_ && scheduled_[int(w)] != 0) schedule(w, scheduled_[int(w)]);
    if (next_try_[int(w)] <= decided_ && trial_left_ == 0) {
      trial_left_ = uncounted(use_, w);  // this call and as many more, the last one counted
      tried_ = w;
    }
  }
  if (trial_left_ > 0) return tried_;
  quiet_ = true;
  quiet_allowed_ = allowed;
  quiet_until_ = UINT64_MAX;
  for (size_t i = 0; i < n; ++i)
    if (ways[i] != use_) quiet_until_ = std::min(quiet_until_, next_try_[int(ways[i])]);
  return use_;
}

void WayChoice::took(Way w, double per_byte) {
  quiet_ = false;
  const Way before = timed_run_.way;  // the way of the last call timed
  timed_run_.add(w);
  const bool counted = timed_run_.calls > timed_run_.uncounted_calls();
  // Note [A spell after a trial]: the window after another way's calls closes past its last call,
  // or at a call of another way; the way in use's counted calls in it count.
  if (after_end_ != 0 && (decided_ > after_end_ || w != use_)) close_window();
  if (after_end_ != 0 && counted) {
    ++after_timed_;
    if (per_byte > kLoud * after_base_) after_over_ += per_byte / after_base_ - 1;
  }
  // A call of the way in use after calls of another (a trial's, or the first calls'; not a change
  // of way, whose first calls find the slots as the way left behind left them) opens one.
  if (w == use_ && before != w && !leaving_ && after_end_ == 0 && cost(use_) > 0) {
    after_way_ = before;
    after_from_ = decided_;
    after_end_ = decided_ + kAfterCalls;
    after_base_ = cost(use_);
    after_over_ = 0;
    after_timed_ = 0;
  }
  // The way left behind goes on for the call decided before it was left: no trial, and its next
  // trial stays where choose() set it.
  const bool left = leaving_ && w == left_;
  // Every call of a trial counts for how loud it was, the first one (not counted below) and the
  // call back after it too: they are the calls a trial slows.
  if (in_trial_ && w != trial_way_) {  // the call back: the trial is over
    in_trial_ = false;
    peak_[int(trial_way_)] = std::max(trial_peak_, per_byte);
    if (trial_way_ != use_) schedule(trial_way_, decided_);
  } else if (settled_ && w != use_ && !left) {
    if (!in_trial_) trial_peak_ = 0;
    in_trial_ = true;
    trial_way_ = w;
    trial_peak_ = std::max(trial_peak_, per_byte);
  }
  if (w == use_) leaving_ = false;
  if (!counted) return;
  Kept& k = kept_[int(w)];
  if (timed(w) == 0) first_timed_[int(w)] = decided_;
  k.times[k.next++ % kKept] = per_byte;
  if (settled_ && (unweighed_ & way_bit(w))) {  // its first trial's time: weighed at the next choice
    unweighed_ &= ~way_bit(w);
    weigh_now_ |= way_bit(w);
  }
  if (settled_ && w != use_ && !left) schedule(w, decided_);  // a trial's time: the next trial goes by it
}

double WayChoice::cost(Way w) const {
  double best = 0;
  for (double t : kept_[int(w)].times)
    if (t > 0 && (best == 0 || t < best)) best = t;
  return best;
}

double WayChoice::latest(Way w) const {
  const Kept& k = kept_[int(w)];
  return k.next == 0 ? 0 : k.times[(k.next - 1) % kKept];
}

size_t WayChoice::timed(Way w) const {
  size_t n = 0;
  for (double t : kept_[int(w)].times) n += t > 0;
  return n;
}

void WayChoice::close_window() {
  // The calls' worth of time the window's calls took over the way in use's cost, by their mean over
  // the window's calls (some are untimed: Note [Timing a few calls]); nothing where under kLoud.
  const double over = after_timed_ > 0 ? after_over_ / double(after_timed_) : 0;
  const double spell = over > kLoud - 1 ? over * double(kAfterCalls) : 0;
  after_end_ = 0;
  if (spell == spell_[int(after_way_)]) return;
  spell_[int(after_way_)] = spell;
  if (settled_ && after_way_ != use_) schedule(after_way_, after_from_);
}

void WayChoice::schedule(Way w, uint64_t from) {
  const double in_use = cost(use_);  // 0 where the way in use was not timed yet (the ways allowed changed)
  const double slower = in_use > 0 ? std::max(1.0, cost(w) / in_use) : 1.0;
  // Timed once, before the way in use first was: perhaps on buffers still warming up, which slow
  // the first calls most (Note [Streaming into the slots]); once more soon, the sooner the closer
  // it was. Timed once after it, its time is no colder than the way in use's, but may have met a
  // preemption: once more kTryClose calls later, past the first calls of a size. More than
  // kColdMost times slower, before or after, is more than warming explains, and its trial's calls
  // would be among the slowest: as a way timed twice and loud.
  // A loud trial (kLoud) of a slower way puts its calls among the slowest: tried at least kTryLoud
  // calls apart, once it has as many times as the way in use (fewer may all have met a slow spell),
  // and kTryLoudOnTwo apart with two times where those say it is more than kLoud slower too: two
  // times close to the way in use's may both have met buffers still warming up or a slow spell,
  // and the calls until the next trial would then go the slower way.
  const bool cold_most = timed(w) < 2 && slower > kColdMost;
  const bool sure = timed(w) >= kKept || (timed(w) == 2 && slower > kLoud);
  const bool loud = cold_most || (sure && slower > 1 && peak_[int(w)] > kLoud * in_use);
  const uint64_t loud_gap = !loud ? 0 : timed(w) >= kKept ? kTryLoud : kTryLoudOnTwo;
  // A spell its last calls set off in the way in use counts with them (Note [A spell after a trial]).
  const double spell = spell_[int(w)];
  const double share_gap = std::max((2 * (slower - 1) + spell) / kTryShare, double(loud_gap));
  const bool colder = first_timed_[int(use_)] == 0 || first_timed_[int(w)] < first_timed_[int(use_)];
  uint64_t gap = uint64_t(std::clamp(share_gap, double(kTryClose), double(kTryMost)));
  // A spell seen after the first calls does not put off a way timed once before the way in use: the
  // window ran on buffers still warming, as that way's one time did.
  if (timed(w) < 2 && !cold_most && (spell == 0 || colder))
    gap =
        colder || cost(w) < in_use ? uint64_t(std::clamp(share_gap, double(kTryLeast), double(kTryClose))) : kTryClose;
  next_try_[int(w)] = from + gap;
  scheduled_[int(w)] = from;
}

void SlotStores::copy_in(void* slot, const void* src, size_t n) {
  if (stream_pace == nullptr || n < kWatchBytes) return copy_out(slot, src, n, stream());
  const bool streams = stream();
  if (!streams && copies < kUnwatched) {  // not judged, so not timed (Note [Timing a few calls])
    ++copies;
    return copy_out(slot, src, n, false);
  }
  const uint64_t t0 = ticks();
  copy_out(slot, src, n, streams);
  const double pace = double(ticks() - t0) / double(n);
  double& fastest = *stream_pace;
  if (fell_back()) owed += std::max(0.0, slow_pace - pace) * double(n);
  if (streams) {
    fastest = fastest == 0 ? pace : std::min(fastest, pace);
    return;
  }
  ++copies;
  const bool slow = fastest > 0 && pace > kFallBack * fastest;
  slow_run = slow ? slow_run + 1 : 0;
  slow_pace = !slow ? 0 : slow_run == 1 ? pace : std::min(slow_pace, pace);
}

}  // namespace chorus::shm
