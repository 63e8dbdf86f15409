// The two halves of checking a call, in one process: argument validation (this rank alone,
// communicator/arguments.h) and the comparison of the ranks' calls (Note [Comparing calls]).
// The multi-process suites check that the messages reach every rank; these check the messages.
// And the lock a call takes on its rank (Note [The call lock]).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "abort_cause.h"
#include "call_compare.h"
#include "chorus/core/error.h"
#include "communicator/arguments.h"
#include "communicator/call_lock.h"

namespace chorus {
namespace {

// What validate_arguments said of `c` as rank `rank` of 4 ("" when it found nothing).
std::string invalid(Call c, int rank = 1) {
  validate_arguments(c, rank, 4, "g");
  return c.invalid;
}

void expect_says(const std::string& got, const std::string& want) {
  EXPECT_NE(got.find(want), std::string::npos) << "\n  got:  " << got << "\n  want: ..." << want << "...";
}

float a[64], b[64];

TEST(ArgumentValidation, GoodCallsPass) {
  EXPECT_EQ(invalid({.kind = OpKind::AllReduce, .dtype = DataType::Float32, .count = 8, .in = a, .out = b}), "");
  EXPECT_EQ(invalid({.kind = OpKind::AllReduce, .dtype = DataType::Float32, .count = 8, .in = a, .out = a}), "");
  EXPECT_EQ(invalid({.kind = OpKind::Reduce, .dtype = DataType::Int32, .root = 0, .count = 8, .in = a}), "")
      << "off the root the output may be null";
  EXPECT_EQ(invalid({.kind = OpKind::AllGather, .dtype = DataType::Float32, .count = 4, .in = a + 4, .out = a}), "")
      << "rank 1's block of the output is the in-place form";
  EXPECT_EQ(invalid({.kind = OpKind::ReduceScatter, .dtype = DataType::Float32, .count = 4, .in = a, .out = a + 4}),
            "");
  EXPECT_EQ(invalid({.kind = OpKind::Barrier}), "");
  EXPECT_EQ(invalid({.kind = OpKind::Split, .count = 2, .counts = {3, 1}}), "");
}

TEST(ArgumentValidation, EachProblemIsNamedWithTheCallGroupAndRank) {
  const std::string mean_int = invalid(
      {.kind = OpKind::AllReduce, .dtype = DataType::Int32, .op = ReduceOp::Mean, .count = 8, .in = a, .out = b});
  expect_says(mean_int, "all_reduce(i32 x 8, mean) on group 'g' (rank 1): ");
  expect_says(mean_int, "truncate");
  expect_says(invalid({.kind = OpKind::AllReduce,
                       .dtype = DataType::Float32,
                       .op = ReduceOp::BitwiseAnd,
                       .count = 8,
                       .in = a,
                       .out = b}),
              "bitwise");
  expect_says(invalid({.kind = OpKind::Broadcast, .dtype = DataType::Float32, .root = 4, .count = 8, .out = a}),
              "root 4 is not a rank of this group (size 4)");
  expect_says(invalid({.kind = OpKind::AllReduce, .dtype = DataType::Float32, .count = 8, .in = nullptr, .out = b}),
              "input is null but must hold 8 elements");
  expect_says(invalid({.kind = OpKind::Reduce, .dtype = DataType::Float32, .root = 1, .count = 8, .in = a}),
              "output is null but must hold 8 elements");
  expect_says(invalid({.kind = OpKind::AllReduce, .dtype = DataType::Float32, .count = 8, .in = a, .out = a + 1}),
              "input and output overlap");
  expect_says(invalid({.kind = OpKind::AllGather, .dtype = DataType::Float32, .count = 4, .in = a, .out = a}),
              "input and output overlap");  // rank 1's block starts 4 elements in, not at 0
  expect_says(invalid({.kind = OpKind::AllGatherV, .dtype = DataType::Float32, .in = a, .out = b, .counts = {1, 2}}),
              "counts has 2 entries but the group has 4 ranks");
  expect_says(invalid({.kind = OpKind::AllToAllV,
                       .dtype = DataType::Float32,
                       .in = a,
                       .out = b,
                       .counts = {1, 1, 1, 1},
                       .recv_counts = {1}}),
              "recv_counts has 1 entries");
  expect_says(invalid({.kind = OpKind::Send, .dtype = DataType::Float32, .root = 1, .count = 1, .in = a}),
              "a rank cannot send to itself");
  expect_says(invalid({.kind = OpKind::Recv, .dtype = DataType::Float32, .root = 2, .tag = -1, .count = 1, .out = a}),
              "tags must be >= 0");
  expect_says(invalid({.kind = OpKind::Split, .count = 2, .counts = {2, 2}}), "rank 2 is listed twice");
  expect_says(invalid({.kind = OpKind::Split}), "the list of ranks is empty");
  expect_says(invalid({.kind = OpKind::AllReduce, .dtype = DataType(99), .count = 1, .in = a, .out = b}),
              "unknown dtype code 99");
}

TEST(ArgumentValidation, OnlyTheFirstProblemIsKeptAndCountsThatCannotTravelAreDropped) {
  Call c{.kind = OpKind::GatherV,
         .dtype = DataType::Float32,
         .root = 9,
         .in = nullptr,
         .out = nullptr,
         .counts = {1, 2, 3}};
  validate_arguments(c, 1, 4, "g");
  expect_says(c.invalid, "root 9 is not a rank");
  EXPECT_EQ(c.invalid.find("counts"), std::string::npos) << c.invalid;
  EXPECT_TRUE(c.counts.empty()) << "a wrong-length counts list must not be published";
}

// Every rank's call, as compare_calls sees them.
struct Ranks {
  std::vector<CallDesc> descs;
  std::vector<std::vector<uint64_t>> counts;
  std::vector<std::array<char, kTextBytes>> texts;
  void add(const Call& c, uint64_t index = 1) {
    descs.push_back(make_desc(c, index));
    auto v = travelling_counts(c);
    v.resize(8, 0);  // 2 * world entries
    counts.push_back(v);
    texts.emplace_back();
    put_text(texts.back().data(), c.invalid);
  }
  std::vector<RankCall> view() const {
    std::vector<RankCall> out;
    for (size_t r = 0; r < descs.size(); ++r) out.push_back({descs[r], counts[r].data(), texts[r].data()});
    return out;
  }
};

Call all_reduce(uint64_t n, DataType dt = DataType::Float32) {
  return {.kind = OpKind::AllReduce, .dtype = dt, .count = n, .in = a, .out = b};
}

TEST(CallComparison, TheSameCallEverywherePasses) {
  Ranks ranks;
  for (int r = 0; r < 4; ++r) ranks.add(all_reduce(8));
  EXPECT_NO_THROW(compare_calls(ranks.view(), 2, 1, "g"));
}

TEST(CallComparison, AMismatchShowsEveryRanksCall) {
  Ranks ranks;
  ranks.add(all_reduce(8));
  ranks.add(all_reduce(8));
  ranks.add(all_reduce(9));
  ranks.add({.kind = OpKind::Broadcast, .dtype = DataType::Float64, .root = 3, .count = 8, .out = a});
  try {
    compare_calls(ranks.view(), 0, 1, "g");
    FAIL() << "no mismatch raised";
  } catch (const CollectiveMismatch& e) {
    const std::string m = e.what();
    expect_says(m, "ranks of group 'g' made different calls at call #1");
    expect_says(m, "rank 0 (call #1): all_reduce(f32 x 8, sum)");
    expect_says(m, "rank 2 (call #1): all_reduce(f32 x 9, sum)");
    expect_says(m, "rank 3 (call #1): broadcast(f64 x 8, root 3)");
    ASSERT_EQ(e.calls().size(), 4u);
    EXPECT_EQ(e.calls()[2], "all_reduce(f32 x 9, sum)");
  }
}

// A rank can learn of a mismatch from a peer that found it first (the peer's abort, carried as
// text through shared memory or the store): it raises the same error with the same calls.
TEST(CallComparison, AMismatchReadFromAPeersAbortShowsEveryRanksCall) {
  Ranks ranks;
  const std::vector<uint64_t> counts = {1, 2, 3, 4};
  for (int r = 0; r < 4; ++r)
    ranks.add(r == 1 ? all_reduce(8)
                     : Call{.kind = OpKind::AllGatherV, .dtype = DataType::Int64, .in = a, .out = b, .counts = counts});
  std::vector<std::string> calls;
  AbortCause cause;
  try {
    compare_calls(ranks.view(), 0, 5, "g");
    FAIL() << "no mismatch raised";
  } catch (const CollectiveMismatch& e) {
    calls = e.calls();
    cause = abort_cause(std::current_exception());
  }
  std::vector<char> field(kAbortTextBytes);
  put_text(field.data(), cause.text, field.size());
  cause.text = field.data();
  try {
    raise_peer_abort(cause, 0, "barrier()", "g");
    FAIL() << "no mismatch raised";
  } catch (const CollectiveMismatch& e) {
    expect_says(e.what(), "barrier() on group 'g': rank 0 gave up first: ranks of group 'g' made different calls");
    ASSERT_EQ(calls.size(), 4u);
    EXPECT_EQ(calls[1], "all_reduce(f32 x 8, sum)");
    EXPECT_EQ(e.calls(), calls);
  }
}

TEST(CallComparison, AnotherRanksInvalidArgumentsReachEveryRankWithItsText) {
  Ranks ranks;
  for (int r = 0; r < 4; ++r) {
    Call c = all_reduce(8);
    if (r == 2) c.invalid = "all_reduce(f32 x 8, sum) on group 'g' (rank 2): input is null";
    ranks.add(c);
  }
  try {
    compare_calls(ranks.view(), 0, 1, "g");
    FAIL() << "no error raised";
  } catch (const InvalidArgument& e) {
    expect_says(e.what(),
                "another rank rejected its arguments (rank 2: all_reduce(f32 x 8, sum) on group 'g' (rank 2): "
                "input is null)");
  }
  try {
    compare_calls(ranks.view(), 2, 1, "g");
    FAIL() << "no error raised";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "all_reduce(f32 x 8, sum) on group 'g' (rank 2): input is null");
  }
}

TEST(CallComparison, AllToAllVCountsMustPairUp) {
  Ranks ranks;
  // Rank p sends 1 element to every rank; rank 3 expects 2 from rank 0.
  for (int r = 0; r < 4; ++r) {
    Call c{.kind = OpKind::AllToAllV,
           .dtype = DataType::Int32,
           .in = a,
           .out = b,
           .counts = {1, 1, 1, 1},
           .recv_counts = {uint64_t(r == 3 ? 2 : 1), 1, 1, 1}};
    ranks.add(c);
  }
  EXPECT_THROW(compare_calls(ranks.view(), 1, 1, "g"), CollectiveMismatch);
}

TEST(CallComparison, FingerprintsIgnoreARejectionButNotTheCall) {
  Call c = all_reduce(8);
  const uint64_t f = fingerprint(make_desc(c, 1), travelling_counts(c));
  c.invalid = "bad";
  EXPECT_EQ(fingerprint(make_desc(c, 1), travelling_counts(c)), f);
  EXPECT_NE(fingerprint(make_desc(all_reduce(9), 1), {}), f);
  EXPECT_NE(fingerprint(make_desc(all_reduce(8), 2), {}), f) << "the call's index counts";
}

// Threads that take the lock in turns, some holding it long enough for the others to sleep on it
// (its contended path): one holder at a time, every increment kept, and every sleeper woken (the
// test ends).
TEST(CallLock, OneHolderAtATimeAndSleepersAreWoken) {
  CallLock lock;
  constexpr int kThreads = 4, kRounds = 20000;
  int64_t count = 0;  // plain: only the lock keeps the increments apart
  std::atomic<int> inside{0}, overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard<CallLock> held(lock);
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++count;
        if (i % 2000 == t) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the others sleep
        inside.fetch_sub(1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(count, int64_t(kThreads) * kRounds);
}

}  // namespace
}  // namespace chorus
