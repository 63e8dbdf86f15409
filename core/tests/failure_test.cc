// What users see when things go wrong: every path ends in a typed error on every rank, names
// the rank and the operation, and leaves nothing in /dev/shm.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "multiprocess.h"

namespace chorus::test {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Failure : public BackendTest {};

TEST_P(Failure, RankThatNeverArrivesIsNamedAtTheDeadline) {
  auto results = run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(1500ms));
    float x = 1;
    comm->all_reduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);  // everyone once
    if (ctx.rank == 2) {  // never calls the next one; stays alive until the others are done
      ctx.store->wait({"done/0", "done/1"}, 60s);
      return;
    }
    try {
      comm->all_reduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
      RANK_CHECK(false, "no timeout");
    } catch (const TimeoutError& e) {
      RANK_CHECK(e.missing_ranks() == std::vector<int>{2}, e.what());
      RANK_CHECK(contains(e.what(), "rank 2") && contains(e.what(), "all_reduce"), e.what());
    }
    // Aborted: the next call fails at once with the same cause.
    auto msg = RANK_EXPECT_THROW(TimeoutError, comm->barrier());
    RANK_CHECK(contains(msg, "rank 2"), msg);
    ctx.store->set("done/" + std::to_string(ctx.rank), "1");
  });
  expect_all_ok(results);
  EXPECT_TRUE(leftover_segments(results).empty());
}

// Rank 0 gives up at its short deadline while rank 1, with a long one, waits in the same call on
// rank 2, which is alive but never comes. Rank 1 must hear of it from rank 0 within seconds, not
// at its own deadline: on Gloo it may wait on a send to rank 2 that nothing but the watchdog
// can end (Note [Interrupting Gloo]).
TEST_P(Failure, ARankThatGaveUpReleasesOneWaitingOnALiveRank) {
  auto results = run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(60s));
    std::vector<float> buf(1 << 16, 1.0f);
    comm->all_reduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);  // all connected
    if (ctx.rank == 2) {
      ctx.store->wait({"done/0", "done/1"}, 60s);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto timeout = ctx.rank == 0 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(60000);
    auto msg = RANK_EXPECT_THROW(
        TimeoutError, comm->all_reduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum, timeout));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    ctx.store->set("done/" + std::to_string(ctx.rank), "1");
    // Rank 0 names rank 2 alone: rank 1 was in the call.
    RANK_CHECK(contains(msg, "rank 2 ") && !contains(msg, "ranks"), msg);
    if (ctx.rank == 1) {
      RANK_CHECK(contains(msg, "rank 0 gave up first"), msg);
      RANK_CHECK(ms < 10s, "released only after ", ms.count(), " ms: ", msg);
    }
  });
  expect_all_ok(results);
  EXPECT_TRUE(leftover_segments(results).empty());
}

// Rank 1 kills itself in the middle of a stream of all-reduces, between ordinary buffers or
// symmetric ones (which shared memory reduces directly between the ranks' buffers).
void killed_rank_is_named_by_survivors(const CommunicatorOptions& opts, bool symmetric) {
  auto results = run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, opts);
    const size_t n = 1 << 22;
    std::vector<float> plain(symmetric ? 0 : n, 1.0f);
    SymmetricMemory mem = symmetric ? comm->alloc_symmetric(n * sizeof(float)) : SymmetricMemory();
    float* buf = symmetric ? static_cast<float*>(mem.data()) : plain.data();
    std::fill(buf, buf + n, 1.0f);
    if (ctx.rank == 1)
      std::thread([] {
        std::this_thread::sleep_for(300ms);
        kill(getpid(), SIGKILL);
      }).detach();
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 1000000; ++i) comm->all_reduce(buf, buf, n, DataType::Float32, ReduceOp::Max);
      RANK_CHECK(false, "no failure seen");
    } catch (const PeerFailure& e) {
      RANK_CHECK(e.failed_rank() == 1, e.what());
      RANK_CHECK(contains(e.what(), "rank 1") && contains(e.what(), "all_reduce"), e.what());
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      std::fprintf(stderr, "[rank %d] PeerFailure after %lld ms (kill at ~300 ms): %s\n", ctx.rank,
                   (long long)ms.count(), e.what());
      // Shared memory sees the death at once; an engine's ranks confirm it by the heartbeats
      // (2.5 s), and a rank that did not talk to the dead one hears it from the watchdog.
      const auto limit = opts.backend == "shm" ? 2300ms : 6s;
      RANK_CHECK(ms < limit, "PeerFailure only after ", ms.count(), " ms");
    }
    RANK_EXPECT_THROW(PeerFailure, comm->barrier());
  });
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].report;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].report;
  EXPECT_TRUE(leftover_segments(results).empty());
}

TEST_P(Failure, KilledRankIsNamedBySurvivorsBeforeTheTimeout) {
  if (GetParam() == "mpi") GTEST_SKIP() << "mpirun ends the job when a rank dies: tests/mpi_rank_killed.sh";
  killed_rank_is_named_by_survivors(options(60s), false);
}

TEST_P(Failure, KilledRankIsNamedBySurvivorsOfADirectAllReduce) {
  if (GetParam() != "shm") GTEST_SKIP() << "only shared memory reduces directly between symmetric buffers";
  killed_rank_is_named_by_survivors(options(60s), true);
}

TEST_P(Failure, RankThatLeftTheGroupIsNamed) {
  auto results = run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(60s));
    if (ctx.rank == 1) {
      comm.reset();
      std::this_thread::sleep_for(1s);
      return;
    }
    auto msg = RANK_EXPECT_THROW(PeerFailure, comm->barrier());
    RANK_CHECK(contains(msg, "rank 1 (on ") && contains(msg, ") left group"), msg);
  });
  expect_all_ok(results);
}

// Each case: what rank 0 calls and what the others call, on a fresh communicator. On shared
// memory the ranks in `leave` receive nothing from their call, so they return before the others
// arrive and their next call raises the mismatch (Note [Owed waits]).
struct MismatchCase {
  const char* name;
  std::function<void(Communicator&, std::vector<float>&)> rank0, others;
  const char* rank0_text;
  const char* others_text;
  std::vector<int> leave = {};
};

TEST_P(Failure, MismatchedCallsRaiseOnEveryRankShowingEachCall) {
  using C = Communicator;
  std::vector<MismatchCase> cases = {
      {"different collectives",
       [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
       [](C& c, auto& b) { c.broadcast(b.data(), 10, DataType::Float32, 0); }, "all_reduce(f32 x 10, sum)",
       "broadcast(f32 x 10, root 0)"},
      {"dtype", [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
       [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 10, DataType::Int32, ReduceOp::Sum); },
       "all_reduce(f32 x 10, sum)", "all_reduce(i32 x 10, sum)"},
      {"count", [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 100000, DataType::Float32, ReduceOp::Sum); },
       [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 99999, DataType::Float32, ReduceOp::Sum); },
       "all_reduce(f32 x 100000, sum)", "all_reduce(f32 x 99999, sum)"},
      {"op", [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Sum); },
       [](C& c, auto& b) { c.all_reduce(b.data(), b.data(), 10, DataType::Float32, ReduceOp::Max); },
       "all_reduce(f32 x 10, sum)", "all_reduce(f32 x 10, max)"},
      {"root",
       [](C& c, auto& b) { c.broadcast(b.data(), 10, DataType::Float32, 0); },
       [](C& c, auto& b) { c.broadcast(b.data(), 10, DataType::Float32, 1); },
       "broadcast(f32 x 10, root 0)",
       "broadcast(f32 x 10, root 1)",
       {0, 1}},
      {"gather into different roots",
       [](C& c, auto& b) { c.gather(b.data(), b.data() + 10, 2, DataType::Float32, 0); },
       [](C& c, auto& b) { c.gather(b.data(), b.data() + 10, 2, DataType::Float32, 2); },
       "gather(f32 x 2, root 0)",
       "gather(f32 x 2, root 2)",
       {1}},
      {"uneven counts",
       [](C& c, auto& b) {
         c.all_gather_v(b.data(), b.data() + 1000, {1, 2, 3}, DataType::Float32);
       },
       [](C& c, auto& b) {
         c.all_gather_v(b.data(), b.data() + 1000, {1, 5, 3}, DataType::Float32);
       },
       "counts [1, 2, 3]", "counts [1, 5, 3]"},
      {"symmetric sizes", [](C& c, auto&) { c.alloc_symmetric(4096); }, [](C& c, auto&) { c.alloc_symmetric(8192); },
       "alloc_symmetric(4096 bytes)", "alloc_symmetric(8192 bytes)"},
      {"symmetric against a barrier", [](C& c, auto&) { c.alloc_symmetric(4096); }, [](C& c, auto&) { c.barrier(); },
       "alloc_symmetric(4096 bytes)", "barrier()"},
  };
  for (const auto& mc : cases) {
    auto results = run_ranks(3, [&](RankContext& ctx) {
      auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(30s));
      std::vector<float> buf(300000, 1.0f);
      comm->barrier();
      auto shows_every_call = [&](const CollectiveMismatch& e) {
        RANK_CHECK(e.calls().size() == 3, e.what());
        RANK_CHECK(contains(e.what(), std::string("rank 0 (call #2): ")) && contains(e.what(), mc.rank0_text) &&
                       contains(e.what(), mc.others_text),
                   e.what());
      };
      const bool leaves = GetParam() == "shm" && std::count(mc.leave.begin(), mc.leave.end(), ctx.rank) == 1;
      try {
        (ctx.rank == 0 ? mc.rank0 : mc.others)(*comm, buf);
        RANK_CHECK(leaves, "no mismatch raised");
      } catch (const CollectiveMismatch& e) {
        RANK_CHECK(!leaves, "raised in a call this rank should have left early: ", e.what());
        shows_every_call(e);
      }
      try {  // the next call raises the same mismatch, whether this rank saw it already or not
        comm->barrier();
        RANK_CHECK(false, "the barrier after the mismatch went through");
      } catch (const CollectiveMismatch& e) {
        shows_every_call(e);
      }
    });
    SCOPED_TRACE(mc.name);
    expect_all_ok(results);
    EXPECT_TRUE(leftover_segments(results).empty());
  }
}

TEST_P(Failure, BadArgumentsOnOneRankRaiseOnEveryRankAndTheGroupGoesOn) {
  auto results = run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(30s));
    std::vector<float> buf(8, 1.0f);
    const int root = ctx.rank == 1 ? 7 : 0;
    std::string msg;
    if (GetParam() == "shm" && ctx.rank == 0) {
      // The root receives nothing, so it returned before the others arrived (Note [Owed waits]).
      comm->broadcast(buf.data(), 8, DataType::Float32, root);
    } else {
      msg = RANK_EXPECT_THROW(InvalidArgument, comm->broadcast(buf.data(), 8, DataType::Float32, root));
      RANK_CHECK(contains(msg, ctx.rank == 1 ? "root 7 is not a rank" : "rank 1"), msg);
    }
    if (GetParam() == "shm") {  // so its next call is refused on every rank, saying why
      msg = RANK_EXPECT_THROW(InvalidArgument, comm->barrier());
      RANK_CHECK(
          contains(msg, "call #1, which rank 0 had left early, was rejected") && contains(msg, "root 7 is not a rank"),
          msg);
    }

    msg = RANK_EXPECT_THROW(InvalidArgument, comm->all_reduce(ctx.rank == 2 ? nullptr : buf.data(), buf.data(), 8,
                                                              DataType::Float32, ReduceOp::Sum));
    RANK_CHECK(contains(msg, ctx.rank == 2 ? "input is null" : "rank 2"), msg);

    // An unknown dtype code (a bad cast) on one rank: still an error everywhere, not a hang.
    msg = RANK_EXPECT_THROW(
        InvalidArgument,
        comm->all_reduce(buf.data(), buf.data(), 8, ctx.rank == 0 ? DataType(42) : DataType::Float32, ReduceOp::Sum));
    RANK_CHECK(contains(msg, ctx.rank == 0 ? "unknown dtype code 42" : "rank 0"), msg);

    std::vector<int32_t> ints(4, 3);
    msg = RANK_EXPECT_THROW(InvalidArgument,
                            comm->all_reduce(ints.data(), ints.data(), 4, DataType::Int32, ReduceOp::Mean));
    RANK_CHECK(contains(msg, "mean of i32 would truncate"), msg);
    msg = RANK_EXPECT_THROW(InvalidArgument,
                            comm->all_reduce(buf.data(), buf.data(), 8, DataType::Float32, ReduceOp::BitwiseXor));
    RANK_CHECK(contains(msg, "floating"), msg);
    msg = RANK_EXPECT_THROW(InvalidArgument, comm->all_gather_v(buf.data(), buf.data(), {1, 1}, DataType::Float32));
    RANK_CHECK(contains(msg, "counts has 2 entries"), msg);
    msg = RANK_EXPECT_THROW(InvalidArgument, comm->all_gather(buf.data() + 1, buf.data(), 2, DataType::Float32));
    RANK_CHECK(contains(msg, "overlap") || ctx.rank != 0, msg);
    RANK_EXPECT_THROW(InvalidArgument, comm->send(buf.data(), 1, DataType::Float32, ctx.rank));

    // The group is still in step.
    comm->all_reduce(ints.data(), ints.data(), 4, DataType::Int32, ReduceOp::Sum);
    RANK_CHECK(ints[3] == 9, ints[3]);
  });
  expect_all_ok(results);
}

TEST_P(Failure, RecvThatDoesNotMatchTheMessageRaisesOnBothEnds) {
  auto results = run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(30s));
    std::vector<float> buf(100, 2.0f);
    if (ctx.rank == 0) {  // shm raises at the next call; gloo's send waits for the receiver's verdict
      auto msg = RANK_EXPECT_THROW(CollectiveMismatch, {
        comm->send(buf.data(), 100, DataType::Float32, 1, /*tag=*/1);
        comm->barrier();
      });
      RANK_CHECK(contains(msg, "rank 1"), msg);
    } else {
      auto msg = RANK_EXPECT_THROW(CollectiveMismatch, comm->recv(buf.data(), 100, DataType::Float32, 0, /*tag=*/2));
      RANK_CHECK(contains(msg, "tag 1"), msg);
    }
  });
  expect_all_ok(results);
}

TEST_P(Failure, RecvFromASilentPeerTimesOutNamingIt) {
  auto results = run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(30s));
    int64_t x = 0;
    if (ctx.rank == 1) {  // never sends; stays alive until rank 0 is done
      ctx.store->wait({"done/0"}, 60s);
      return;
    }
    try {
      comm->recv(&x, 1, DataType::Int64, 1, 0, 800ms);
      RANK_CHECK(false, "no timeout");
    } catch (const TimeoutError& e) {
      RANK_CHECK(e.missing_ranks() == std::vector<int>{1}, e.what());
      RANK_CHECK(contains(e.what(), "recv"), e.what());
    }
    ctx.store->set("done/0", "1");
  });
  expect_all_ok(results);
}

TEST_P(Failure, RankThatNeverJoinsTheGroupIsNamed) {
  auto results = run_ranks(3, [&](RankContext& ctx) {
    if (ctx.rank == 2) return;
    try {
      Communicator::create(ctx.store, ctx.rank, ctx.world, options(1s));
      RANK_CHECK(false, "created without rank 2");
    } catch (const TimeoutError& e) {
      RANK_CHECK(e.missing_ranks() == std::vector<int>{2}, e.what());
    }
  });
  expect_all_ok(results);
  EXPECT_TRUE(leftover_segments(results).empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, Failure, ::testing::ValuesIn(test_backends()), backend_param_name);

}  // namespace
}  // namespace chorus::test
