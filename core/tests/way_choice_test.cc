// Rank 0's choice of the way a staged call moves its data (Note [Streaming into the slots]):
// WayChoice on its own, fed the times a group would give it, call after call.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "shm/slot_stores.h"

namespace chorus::test {
namespace {

// The choice itself, one call ahead as the group makes it: the faster way by the fastest of its
// last times, and the others now and then, so that a change is seen. `cost` gives a way's time;
// each call reports `switching` where it is not counted (the first call, a call that went another
// way than the one before): 0.1 by default, a time that would turn the choice if it were counted;
// the others cost(way, run), run the call's place among the calls in a row of its way (2 and on).
// Calls are of `bytes`; only those the choice times report their time (took()), and `timed` gets
// their numbers. At the default size every call is timed where a way costs 1 or more per byte
// (kUntimedTicks), and the first calls time each way for its first calls only (kWarmBelow). The
// ways the calls went.
constexpr size_t kEveryCallTimed = 4 << 20;
std::vector<shm::Way> run_choice(shm::WayChoice& choice, unsigned allowed, int calls,
                                 const std::function<double(shm::Way, int)>& cost, double switching = 0.1,
                                 size_t bytes = kEveryCallTimed, std::vector<int>* timed = nullptr) {
  std::vector<shm::Way> went;
  shm::Way way = shm::Way(__builtin_ctz(allowed));  // the first call goes the first allowed way
  int run = 0;
  for (int call = 1; call <= calls; ++call) {
    const shm::Way next = choice.choose(allowed, bytes);  // at the call's start, for the next one
    run = call > 1 && went.back() == way ? run + 1 : 1;
    if (choice.timing()) {
      choice.took(way, run == 1 ? switching : cost(way, run));
      if (timed) timed->push_back(call);
    }
    went.push_back(way);
    way = next;
  }
  return went;
}

// The calls among `went` (numbered from 1) that did not go `way`.
std::vector<int> not_going(const std::vector<shm::Way>& went, shm::Way way) {
  std::vector<int> calls;
  for (size_t i = 0; i < went.size(); ++i)
    if (went[i] != way) calls.push_back(int(i) + 1);
  return calls;
}

TEST(WayChoice, RankZeroStreamsIntoTheSlotsWhereThatWasFaster) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  shm::WayChoice choice;
  // Each way twice first, then the faster timed so far (streaming's second call is timed only
  // once the call after it is decided), then the faster, but the other for two calls once more
  // within 32 calls (it was timed once, on colder buffers: kTryClose, where its cost would say
  // 100); then, counted from the call back after that trial, every 2 (s - 1) / 2% = 100 calls, s
  // how much slower it was (at least 64 once it has two times, where its trial calls are among the
  // slowest, kLoud), until it has three times; then 256 calls apart (kTryLoud).
  auto went = run_choice(choice, stores, 420, [](Way w, int) { return w == Way::kStream ? 1.0 : 2.0; });
  EXPECT_EQ(std::vector<Way>(went.begin(), went.begin() + 6),
            (std::vector<Way>{Way::kNormal, Way::kNormal, Way::kStream, Way::kStream, Way::kNormal, Way::kStream}));
  EXPECT_EQ(not_going(went, Way::kStream), (std::vector<int>{1, 2, 5, 39, 40, 142, 143, 401, 402}));
  // A way ten times slower is tried every 900 calls: trials stay out of the slowest 5% of calls.
  // Its first time, ten times streaming's, is more than warming buffers explain (kColdMost): it is
  // tried once more not 8 calls later but as a way loud on two times is, 900 calls later too. One
  // 6% slower, whose trials are quiet (within kLoud), not every 6 but every 32 or so (kTryClose): a
  // trial and the change of way after it are slower calls whatever the way costs.
  shm::WayChoice far;
  EXPECT_EQ(
      not_going(run_choice(far, stores, 1000, [](Way w, int) { return w == Way::kStream ? 1.0 : 10.0; }), Way::kStream),
      (std::vector<int>{1, 2, 5, 907, 908}));
  // Three and a half times slower on its one time (the W=2 64 MiB all_gather's normal stores beside
  // a CPU-bound process, in the VM's slow state: 82-98 ms against streaming's 24): not tried again
  // in a run of 3 untimed and 40 timed calls, where its trial's calls would be the p95.
  shm::WayChoice slow_state;
  EXPECT_EQ(not_going(run_choice(slow_state, stores, 43, [](Way w, int) { return w == Way::kStream ? 1.0 : 3.5; }),
                      Way::kStream),
            (std::vector<int>{1, 2, 5}));
  // Five times slower, but timed once against the way in use's first counted call, a slow one (the
  // W=2 64 MiB all_gather beside a CPU-bound process: normal stores at 97 ms, streaming's second
  // call at 39 and the calls after it at 17-24): 2.5 times slower by the first times, tried again 8
  // calls later by them, but by the times as they are when that trial falls due, five times: not
  // tried again in the run either.
  shm::WayChoice stale;
  EXPECT_EQ(not_going(run_choice(stale, stores, 43,
                                 [](Way w, int run) { return w == Way::kStream ? (run == 2 ? 2.0 : 1.0) : 5.0; }),
                      Way::kStream),
            (std::vector<int>{1, 2, 5}));
  shm::WayChoice close;
  EXPECT_EQ(
      not_going(run_choice(close, stores, 90, [](Way w, int) { return w == Way::kStream ? 1.0 : 1.06; }), Way::kStream),
      (std::vector<int>{1, 2, 5, 15, 16, 50, 51, 85, 86}));
  // The same close way, but the first call of each trial, after the change of way, twice as slow
  // (streaming stores leave the slots in memory, and normal stores fetch them back): loud, so
  // tried 256 calls apart once it has three times (with two, only a way more than kLoud slower
  // is judged loud: two times may both have met warming buffers or a slow spell).
  shm::WayChoice loud;
  EXPECT_EQ(not_going(run_choice(
                          loud, stores, 350, [](Way w, int) { return w == Way::kStream ? 1.0 : 1.06; }, 2.0),
                      Way::kStream),
            (std::vector<int>{1, 2, 5, 15, 16, 50, 51, 309, 310}));
  // Back to the first choice, after its 420 calls:
  choice.took(Way::kStream, 9.0);  // one slow call (a preemption) does not turn the choice
  EXPECT_EQ(choice.choose(stores, kEveryCallTimed), Way::kStream);
  choice.took(Way::kStream, 2.1);  // nor does a small difference:
  choice.took(Way::kStream, 2.1);  // the way in use keeps going until the other is clearly faster
  EXPECT_EQ(choice.choose(stores, kEveryCallTimed), Way::kStream);
  choice.took(Way::kStream, 3.0);  // the cores moved: streaming is now the slower way, and the
  choice.took(Way::kStream, 3.0);  // kept times of streaming all say so
  choice.took(Way::kStream, 3.0);
  EXPECT_EQ(choice.choose(stores, kEveryCallTimed), Way::kNormal);
}

// A way timed once, on buffers still warming up (bench/chorus_bench.cc's Note [Warm buffers]),
// is timed again soon; each trial's own time sets when the next comes, and the way is taken once
// it is the faster.
TEST(WayChoice, RankZeroTimesAgainAWayItTimedOnce) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  shm::WayChoice choice;
  int normal_timed = 0;
  auto went = run_choice(choice, stores, 90, [&](Way w, int) {
    if (w == Way::kStream) return 1.5;
    ++normal_timed;  // normal stores' buffers warm up: twice as slow as streaming, then a little, then faster
    return normal_timed == 1 ? 3.0 : normal_timed == 2 ? 1.6 : 1.0;
  });
  // Streaming on the first times; normal stores timed again within 32 calls, at calls 39-40 (they
  // had one time, on colder buffers: not 100 calls later, as that time would say), 7% slower
  // there, so tried again 32 calls after the call back (kTryClose), and taken (the call after the
  // trial was decided before the trial's time came in). Streaming, the way left behind, would be
  // tried again 32 calls later.
  std::vector<int> streaming{3, 4};
  auto calls = [&](int from, int to) {
    for (int k = from; k <= to; ++k) streaming.push_back(k);
  };
  calls(6, 38);
  calls(41, 73);
  calls(76, 76);
  EXPECT_EQ(not_going(went, Way::kNormal), streaming);
}

// Below kWarmBelow the first calls of a size warm their buffers over tens of calls (Note [Warm
// buffers] in bench/chorus_bench.cc), and normal stores most: the first way goes on for kWarmCalls
// more calls before the others are timed. Timed on its second call, the coldest, it lost the first
// choice to a way timed after it, and came back only at its trial.
TEST(WayChoice, RankZeroWarmsTheFirstWayBeforeTimingTheOthers) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  auto warming = [](int* normal_timed) {
    return [normal_timed](Way w, int) {
      if (w == Way::kStream) return 1.5;
      return ++*normal_timed < 8 ? 3.0 : 1.0;  // normal stores reach their pace on their 8th counted call
    };
  };
  int timed_small = 0, timed_large = 0;
  shm::WayChoice small, large;
  const auto went = run_choice(small, stores, 60, warming(&timed_small), 0.1, 1 << 20);
  // Normal stores for 16 calls, streaming for two, then normal stores, the faster by their last
  // times; streaming is tried again 32 calls after the first choice (kTryClose).
  EXPECT_EQ(not_going(went, Way::kNormal), (std::vector<int>{17, 18, 52, 53}));
  // 4 MiB or more: each way for its first calls only, and streaming taken on those times.
  const auto first = run_choice(large, stores, 8, warming(&timed_large));
  EXPECT_EQ(first.back(), Way::kStream);
}

// A slow spell of the machine slows whichever way is in use: three slow calls of streaming turn the
// choice to normal stores, timed again just after the spell. Streaming, the way left behind, is
// tried again 32 calls later (kTryClose) whatever its last times say, and taken back.
TEST(WayChoice, RankZeroTriesAgainTheWayItLeft) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  shm::WayChoice choice;
  int timed = 0;  // the calls timed so far, the clock of the spell
  auto went = run_choice(choice, stores, 200, [&](Way w, int) {
    ++timed;
    if (w == Way::kNormal) return timed >= 60 && timed < 65 ? 2.6 : 1.3;
    return timed >= 60 && timed < 65 ? 2.0 : 1.0;  // the spell: every way twice as slow
  });
  // Normal stores' trial at 37-38 (timed once, 30% slower: 30 calls later), loud, so the next one
  // 64 calls later; but the spell's slow calls of streaming turn the choice first: normal stores
  // from 70.
  std::vector<int> normal{1, 2, 5, 37, 38};
  for (int k = 70; k <= 101; ++k) normal.push_back(k);
  // Streaming's trial at 102-103, the call back at 104, then streaming; normal stores, left behind
  // in turn, are tried 32 calls later, and after that every 256 (their trials are loud).
  normal.push_back(104);
  normal.push_back(137);
  normal.push_back(138);
  EXPECT_EQ(not_going(went, Way::kStream), normal);
}

// Note [Single-copy collectives] as a third way: tried after the two ways of storing, taken where
// it is the fastest, and each other way tried as often as its cost says; one allowed way is no
// choice at all.
TEST(WayChoice, RankZeroReadsThePeersWhereThatWasFaster) {
  using shm::Way;
  const unsigned all = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream) | shm::way_bit(Way::kSingleCopy);
  shm::WayChoice choice;
  auto went = run_choice(choice, all, 600, [](Way w, int) {
    return w == Way::kSingleCopy ? 1.0 : w == Way::kStream ? 2.0 : 3.0;
  });
  // A single copy three times (its third call counted: kUncounted), then streaming, the fastest of
  // the ways through the slots: the first choice leaves the single copy out, whose first calls ran
  // on warmer buffers than theirs. Its one time was faster than streaming's: tried 8 calls on
  // (kTryLeast), three calls, and weighed by that trial's time as the first choice weighs: taken
  // from call 21 (call 20 was decided before the trial's time came in).
  EXPECT_EQ(std::vector<Way>(went.begin(), went.begin() + 9),
            (std::vector<Way>{Way::kNormal, Way::kNormal, Way::kStream, Way::kStream, Way::kSingleCopy,
                              Way::kSingleCopy, Way::kSingleCopy, Way::kStream, Way::kStream}));
  // Each other way is then tried as its times say, for three calls (after single copies the slots
  // reach their pace on their third call: uncounted()): normal stores, timed once on colder buffers,
  // within 32 calls of the first choice; streaming, the way left behind, 32 calls after it was
  // left; then, their trials loud (kLoud) and with three times each, every 256 calls or so.
  std::vector<int> others{1, 2, 3, 4};
  for (int call = 8; call <= 16; ++call) others.push_back(call);
  for (int call : {20, 41, 42, 43, 53, 54, 55, 245, 246, 247, 313, 314, 315, 505, 506, 507, 573, 574, 575})
    others.push_back(call);
  EXPECT_EQ(not_going(went, Way::kSingleCopy), others);
  auto way_of = [&](int call) { return went[size_t(call - 1)]; };  // calls numbered from 1
  for (int call : {41, 43, 245, 247, 505, 507}) EXPECT_EQ(way_of(call), Way::kNormal) << call;
  for (int call : {16, 20, 53, 55, 313, 315, 573, 575}) EXPECT_EQ(way_of(call), Way::kStream) << call;
  // Single copies were stopped: the choice goes on between the other two, on their times.
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  EXPECT_EQ(choice.choose(stores, kEveryCallTimed), Way::kStream);
  shm::WayChoice told;  // a setting leaves one way: no trials
  EXPECT_EQ(
      not_going(run_choice(told, shm::way_bit(Way::kSingleCopy), 100, [](Way, int) { return 1.0; }), Way::kSingleCopy),
      std::vector<int>{});
}

// Where a call's copies out may stream, that is a fourth way (Note [Streaming out with the slots]):
// normal stores into the slots, streaming ones out of them. It is timed after the others, and
// taken where it was the fastest; its calls stream their copies out, and only its calls and those
// whose group's buffers outgrow the caches do.
TEST(WayChoice, RankZeroStreamsTheCopiesOutWhereThatWasFaster) {
  using shm::Way;
  const unsigned all = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream) | shm::way_bit(Way::kStreamOut);
  shm::WayChoice choice;
  auto went = run_choice(choice, all, 200, [](Way w, int) {
    return w == Way::kStreamOut ? 1.0 : w == Way::kNormal ? 1.2 : 2.0;
  });
  // Normal stores, the fastest timed while the fourth way's counted call runs, then the fourth way.
  EXPECT_EQ(std::vector<Way>(went.begin(), went.begin() + 8),
            (std::vector<Way>{Way::kNormal, Way::kNormal, Way::kStream, Way::kStream, Way::kStreamOut, Way::kStreamOut,
                              Way::kNormal, Way::kStreamOut}));
  EXPECT_GT(std::count(went.begin(), went.end(), Way::kStreamOut), 180);
  shm::SlotStores s;
  for (Way w : {Way::kNormal, Way::kStream, Way::kSingleCopy, Way::kStreamOut, Way::kStreamBoth}) {
    s.way = w;
    EXPECT_EQ(s.stream_out(false), w == Way::kStreamOut || w == Way::kStreamBoth) << int(w);
    EXPECT_TRUE(s.stream_out(true)) << int(w);
    EXPECT_EQ(s.stream(), w == Way::kStream || w == Way::kStreamBoth) << int(w);
  }
}

// The stores into the slots and the copies out stream or not apart, so a call that may stream its
// copies out has four ways through the slots, the fifth streaming both (Note [Streaming out with
// the slots]: W=2, 16 MiB all_reduce on the Zen 3 VM where its vCPUs share no cache, 2.0-2.2 ms
// against 2.6-3.1 streaming into the slots alone and 4.5-6.5 out alone). Timed last, taken where
// it is the fastest.
TEST(WayChoice, RankZeroStreamsIntoTheSlotsAndOutWhereThatWasFaster) {
  using shm::Way;
  const unsigned all = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream) | shm::way_bit(Way::kStreamOut) |
                       shm::way_bit(Way::kStreamBoth);
  shm::WayChoice choice;
  auto went = run_choice(choice, all, 200, [](Way w, int) {
    return w == Way::kStreamBoth ? 1.0 : w == Way::kStream ? 1.3 : w == Way::kNormal ? 2.5 : 2.2;
  });
  EXPECT_EQ(std::vector<Way>(went.begin(), went.begin() + 10),
            (std::vector<Way>{Way::kNormal, Way::kNormal, Way::kStream, Way::kStream, Way::kStreamOut, Way::kStreamOut,
                              Way::kStreamBoth, Way::kStreamBoth, Way::kStream, Way::kStreamBoth}));
  EXPECT_GT(std::count(went.begin(), went.end(), Way::kStreamBoth), 180);
}

// A single copy after calls through the slots reaches its pace on its third call in a row (Note
// [Streaming into the slots]): timed on its second, 30% slower there, it would never be taken
// where it is 8% faster. Its trials are three calls, the third counted.
TEST(WayChoice, RankZeroTimesASingleCopyOnItsThirdCallInARow) {
  using shm::Way;
  const unsigned all = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream) | shm::way_bit(Way::kSingleCopy);
  auto cost = [](double single_copy) {
    return [single_copy](Way w, int run) {
      if (w == Way::kSingleCopy) return run == 2 ? 1.3 : single_copy;
      return w == Way::kStream ? 1.5 : 1.0;
    };
  };
  shm::WayChoice faster;
  const auto went = run_choice(faster, all, 100, cost(0.92));
  // Left out of the first choice (normal stores, calls 8-16), and tried 8 calls later (its one time
  // was the faster: kTryLeast), where its third call, 8% faster than normal stores, takes it: the
  // first trial of a way left out of the first choice is weighed as that choice weighs, without
  // kSwitchBelow's margin.
  EXPECT_EQ(std::vector<Way>(went.begin() + 4, went.begin() + 10),
            (std::vector<Way>{Way::kSingleCopy, Way::kSingleCopy, Way::kSingleCopy, Way::kNormal, Way::kNormal,
                              Way::kNormal}));
  // Streaming, timed once after normal stores first were (not on colder buffers), is tried again 32
  // calls after the first choice (kTryClose), normal stores, the way left behind, 32 calls after
  // they were left; both for three calls, the slots' pace after single copies (uncounted()).
  std::vector<int> others{1, 2, 3, 4};
  for (int call = 8; call <= 16; ++call) others.push_back(call);
  for (int call : {20, 41, 42, 43, 53, 54, 55, 89, 90, 91}) others.push_back(call);
  EXPECT_EQ(not_going(went, Way::kSingleCopy), others);
  for (int call : {16, 17, 18, 19})
    EXPECT_EQ(went[size_t(call - 1)], call == 16 ? Way::kNormal : Way::kSingleCopy) << call;
  for (int call : {20, 53, 55}) EXPECT_EQ(went[size_t(call - 1)], Way::kNormal) << call;
  for (int call : {41, 43}) EXPECT_EQ(went[size_t(call - 1)], Way::kStream) << call;
  // Slower, it is left, and tried for three calls in a row now and then. It and streaming were
  // timed once each, after normal stores first were: not on colder buffers than normal stores, so
  // tried again not as soon as their cost says, as a way timed before the way in use is (the single
  // copy, 20% slower, 20 calls on; RankZeroTimesAgainAWayItTimedOnce), but 32 (kTryClose), past the
  // first calls of a size; streaming first, then the single copy (one trial waits for the other).
  shm::WayChoice slower;
  const auto left = run_choice(slower, all, 100, cost(1.2));
  EXPECT_EQ(not_going(left, Way::kNormal), (std::vector<int>{3, 4, 5, 6, 7, 41, 42, 43, 44, 45}));
  for (int call : {5, 6, 7, 43, 44, 45}) EXPECT_EQ(left[size_t(call - 1)], Way::kSingleCopy) << call;
}

// Timing a call costs rank 0 more than its clock reads: where the way in use goes on steadily, it
// times one call in a few, about every kUntimedTicks of calls by the way's cost (Note [Timing a few
// calls]). The calls it does not time still count for the trials.
TEST(WayChoice, RankZeroTimesOneCallInAFewWhereTheWayInUseGoesOn) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  // Normal stores three times slower from the slow_from-th counted call on (a call that went the
  // way of the call before reports cost(); the others report `switching`).
  auto cost = [](int slow_from) {
    return [slow_from, counted = 0](Way w, int) mutable {
      const bool slow = ++counted >= slow_from;
      return w == Way::kStream ? 2.0 : slow ? 3.0 : 1.0;
    };
  };
  // 16 KiB calls of normal stores at 1 tick per byte: one in four timed once the choice settled.
  // Every call before that, and each trial's calls, with the call back after them and the next.
  shm::WayChoice small;
  std::vector<int> timed;
  const auto went = run_choice(small, stores, 200, cost(1 << 30), 0.1, 16 << 10, &timed);
  // (Below kWarmBelow, the first calls are normal stores' 16 and streaming's two, and the first
  // choice is made at call 19.)
  std::vector<int> expected;
  for (int call = 1; call <= 20; ++call) expected.push_back(call);
  for (int call = 24; call < 52; call += 4) expected.push_back(call);
  expected.insert(expected.end(), {52, 53, 54, 55});
  for (int call = 59; call < 155; call += 4) expected.push_back(call);
  expected.insert(expected.end(), {155, 156, 157, 158});
  for (int call = 162; call <= 200; call += 4) expected.push_back(call);
  EXPECT_EQ(timed, expected);
  // The trials fall where they fall with every call timed (1 MiB calls, also below kWarmBelow).
  shm::WayChoice every;
  EXPECT_EQ(not_going(went, Way::kNormal), (std::vector<int>{17, 18, 52, 53, 155, 156}));
  EXPECT_EQ(not_going(run_choice(every, stores, 200, cost(1 << 30), 0.1, 1 << 20), Way::kNormal),
            not_going(went, Way::kNormal));
  // Normal stores three times slower from a counted call on: the choice turns to streaming once
  // the kept times all say so, three counted calls later.
  shm::WayChoice slowed;
  timed.clear();
  const auto turned = run_choice(slowed, stores, 120, cost(20), 0.1, 16 << 10, &timed);
  std::vector<int> counted;
  for (int call : timed)
    if (call > 1 && turned[size_t(call - 1)] == turned[size_t(call - 2)]) counted.push_back(call);
  ASSERT_GE(counted.size(), 22u);
  EXPECT_EQ(std::vector<int>(counted.begin() + 19, counted.begin() + 22), (std::vector<int>{32, 36, 40}));
  EXPECT_EQ(std::find(turned.begin() + 32, turned.end(), Way::kStream) - turned.begin() + 1, 42);
  // 1 MiB calls: every call timed.
  shm::WayChoice large;
  timed.clear();
  run_choice(large, stores, 100, cost(1 << 30), 0.1, 1 << 20, &timed);
  EXPECT_EQ(timed.size(), 100u);
}

// Calls of streaming stores may set off a slow spell of the normal stores after them (Note [A spell
// after a trial]): the spell counts with the trial's own calls, and the next trial comes later.
TEST(WayChoice, RankZeroTriesSeldomAWayWhoseCallsSetOffASpell) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  // Streaming stores 1.7 times normal ones; after calls of them, the next `spell` counted calls of
  // normal stores take as long.
  auto cost = [](int spell) {
    return [spell, left = 0](Way w, int) mutable {
      if (w == Way::kStream) {
        left = spell;
        return 1.7;
      }
      return left-- > 0 ? 1.7 : 1.0;
    };
  };
  // Without a spell, streaming is timed once in the first calls and tried again 32 calls later
  // (kTryClose), then every 2 (s - 1) / 2% = 70 calls, then, with three times and its trials loud
  // (kLoud), 256 calls apart.
  shm::WayChoice quiet;
  const std::vector<int> quiet_trials = {3, 4, 38, 39, 111, 112, 370, 371};
  EXPECT_EQ(not_going(run_choice(quiet, stores, 400, cost(0)), Way::kNormal), quiet_trials);
  // With a spell of 30 calls after them, the first calls count for their own 2 * 0.7 calls over
  // normal stores' time and the window's 24 * 0.7: the next trial is (1.4 + 16.8) / 2% = 910 calls
  // after the first call of the window.
  shm::WayChoice spelled;
  EXPECT_EQ(not_going(run_choice(spelled, stores, 1000, cost(30)), Way::kNormal), (std::vector<int>{3, 4, 915, 916}));
  // A spell of 3 calls is not one: over the window's 24 calls, 3 * 0.7 is under kLoud.
  shm::WayChoice short_spell;
  EXPECT_EQ(not_going(run_choice(short_spell, stores, 400, cost(3)), Way::kNormal), quiet_trials);
}

// But not a way timed once before the way in use, in the first calls: the calls after them run on
// buffers still warming up, as its one time did, and it is tried again within kTryClose calls all
// the same (Note [A spell after a trial]).
TEST(WayChoice, RankZeroTriesAColderWaySoonWhateverTheFirstCallsSetOff) {
  using shm::Way;
  const unsigned stores = shm::way_bit(Way::kNormal) | shm::way_bit(Way::kStream);
  // Normal stores 1.3 times streaming ones on their first calls; streaming taken, its first
  // `spell` counted calls after them take 1.15 (over kLoud, but not enough to turn the choice).
  auto cost = [](int spell) {
    return [spell, streamed = 0](Way w, int) mutable {
      if (w == Way::kNormal) return 1.3;
      ++streamed;
      return streamed > 1 && streamed <= 1 + spell ? 1.15 : 1.0;
    };
  };
  // Normal stores first, streaming timed after them and taken at call 6; normal stores, timed
  // before it, tried again 2 * 0.3 / 2% = 30 calls later (within kTryClose), and then, slower by
  // more than kLoud on two times, not within the next 64 calls (kTryLoudOnTwo).
  shm::WayChoice quiet;
  EXPECT_EQ(not_going(run_choice(quiet, stores, 100, cost(0)), Way::kStream), (std::vector<int>{1, 2, 5, 37, 38}));
  // A spell of 30 calls after the first calls counts 24 * 0.15 calls against normal stores, which
  // would put their trial 210 calls on; it comes kTryClose calls after the window's first call.
  shm::WayChoice spelled;
  EXPECT_EQ(not_going(run_choice(spelled, stores, 100, cost(30)), Way::kStream), (std::vector<int>{1, 2, 5, 39, 40}));
}

// Each rank watches its own copies into the slots (Note [Falling back within a call]): normal
// stores more than kFallBack times slower than its fastest streamed copy of such calls, kSlowInRow
// copies in a row past the call's first kUnwatched, make the rest of the call's stores streaming
// ones. A pace of almost nothing makes every normal copy slow; one of a second per byte, none.
TEST(SlotStores, ARankStreamsTheRestOfACallWhereItsNormalStoresSlowed) {
  using shm::Way;
  constexpr size_t n = shm::SlotStores::kWatchBytes;
  std::vector<uint8_t> src(n), slot(n);
  for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 7 + 1);
  auto call = [&](Way way, double* pace, size_t bytes, int copies) {
    shm::SlotStores s;
    s.way = way;
    s.large = true;
    s.stream_pace = pace;
    std::vector<bool> streamed;
    for (int k = 0; k < copies; ++k) {
      std::fill(slot.begin(), slot.end(), uint8_t(0));
      s.copy_in(slot.data(), src.data(), bytes);
      EXPECT_TRUE(std::equal(src.begin(), src.begin() + std::ptrdiff_t(bytes), slot.begin())) << k;
      streamed.push_back(s.stream());
    }
    return streamed;
  };
  double fast = 1e-12;
  const int judged = shm::SlotStores::kUnwatched + shm::SlotStores::kSlowInRow;
  auto fell = call(Way::kNormal, &fast, n, judged + 2);
  EXPECT_EQ(std::count(fell.begin(), fell.end(), false), judged - 1);
  EXPECT_TRUE(fell.back());
  EXPECT_EQ(fast, 1e-12);  // a streamed copy slower than the pace leaves it
  // Not where its copies are quick, nor where they are small, nor unwatched, nor before any copy
  // of these calls was streamed: their pace is not known yet.
  double slow = 2.6e9;
  for (bool s : call(Way::kNormal, &slow, n, 8)) EXPECT_FALSE(s);
  for (bool s : call(Way::kNormal, &fast, n - 64, 8)) EXPECT_FALSE(s);
  for (bool s : call(Way::kNormal, nullptr, n, 8)) EXPECT_FALSE(s);
  double unknown = 0;
  for (bool s : call(Way::kNormal, &unknown, n, 8)) EXPECT_FALSE(s);
  // A streamed call sets the pace.
  for (bool s : call(Way::kStream, &unknown, n, 2)) EXPECT_TRUE(s);
  EXPECT_GT(unknown, 0);
}

}  // namespace
}  // namespace chorus::test
