// The calls at the edges of a group's life: a rank that reaches a call after its peers gave up on
// it, and a last call that a rank left early (Note [Owed waits]) with no next call to check it.
// Each must end in an error on the rank concerned, never in a result or in silence.
#include <gtest/gtest.h>

#include <thread>

#include "multiprocess.h"

namespace chorus::test {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class LastCall : public BackendTest {
 protected:
  void SetUp() override {
    if (GetParam() == "mpi") GTEST_SKIP() << "an MPI job ends when a rank gives up (tests/mpi_rank_killed.sh)";
  }
};

// Ranks 0 and 2 give up on an all_reduce at their 1 s deadline while rank 1 sleeps; rank 1 then
// makes the call. Its peers' contributions were posted before they gave up, so a small message
// could complete: it must raise as they did, at any size (Note [Aborted in the call line]).
void late_rank_raises(const CommunicatorOptions& options, size_t count) {
  expect_all_ok(run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
    std::vector<float> buf(count, 1.0f);
    comm->all_reduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum);  // all connected
    if (ctx.rank == 1) {
      ctx.store->wait({"gave_up/0", "gave_up/2"}, 60s);
      auto msg =
          RANK_EXPECT_THROW(Error, comm->all_reduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum));
      RANK_CHECK(contains(msg, "rank 1") && contains(msg, "all_reduce"), msg);
      RANK_EXPECT_THROW(Error, comm->barrier());  // aborted here too
      ctx.store->set("done/1", "1");
      return;
    }
    auto msg =
        RANK_EXPECT_THROW(Error, comm->all_reduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum));
    RANK_CHECK(contains(msg, "rank 1"), msg);
    ctx.store->set("gave_up/" + std::to_string(ctx.rank), "1");
    ctx.store->wait({"done/1"}, 60s);  // alive until rank 1 has seen it
  }));
}

TEST_P(LastCall, ARankThatArrivesAfterItsPeersGaveUpRaisesWithATinyMessage) { late_rank_raises(options(1s), 2); }

TEST_P(LastCall, ARankThatArrivesAfterItsPeersGaveUpRaisesWithALargeMessage) { late_rank_raises(options(1s), 1 << 20); }

// Rank 0 broadcasts 8 bytes as root while rank 1 calls an all_reduce. On shared memory the root
// leaves its broadcast before the calls are compared; with no next call, shutdown() must find
// the mismatch. Other backends may find it in the broadcast itself.
TEST_P(LastCall, ShutdownReportsAMismatchInTheLastCall) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(20s));
    float x = 1;
    if (ctx.rank == 1) {
      auto msg = RANK_EXPECT_THROW(CollectiveMismatch, comm->all_reduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum));
      RANK_CHECK(contains(msg, "broadcast"), msg);
      ctx.store->wait({"done/0"}, 60s);
      return;
    }
    std::string msg;
    try {
      comm->broadcast(&x, 1, DataType::Float32, 0);
      msg = RANK_EXPECT_THROW(CollectiveMismatch, comm->shutdown());
    } catch (const CollectiveMismatch& e) {
      RANK_CHECK(GetParam() != "shm", "shared memory's root raised in the broadcast itself: ", e.what());
      msg = e.what();
    }
    RANK_CHECK(contains(msg, "all_reduce") && contains(msg, "broadcast"), msg);
    RANK_EXPECT_THROW(Error, comm->barrier());  // no call after a shutdown or a mismatch
    comm->shutdown();                           // idempotent
    ctx.store->set("done/0", "1");
  }));
}

// A clean end: every rank's last call matches, and shutdown on each returns; later calls fail
// saying the group was shut down.
TEST_P(LastCall, ShutdownAfterMatchingCallsReturnsAndLaterCallsFail) {
  expect_all_ok(run_ranks(3, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(20s));
    float x = float(ctx.rank);
    comm->broadcast(&x, 1, DataType::Float32, 0);
    RANK_CHECK(x == 0.0f);
    if (ctx.rank != 0) std::this_thread::sleep_for(200ms);  // the root shuts down first
    comm->shutdown();
    auto msg = RANK_EXPECT_THROW(Error, comm->barrier());
    RANK_CHECK(contains(msg, "shut down"), msg);
  }));
}

// Rank 0 sends twice without waiting and shuts down at once; rank 1 receives a moment later. The
// second send starts only when the first is received, long after shutdown() began, which waits
// for both: leaving first would strand them (rank 1 would hear "rank 0 left").
TEST_P(LastCall, ShutdownWaitsForTheSendsInFlight) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(20s));
    std::vector<float> first(1 << 20, ctx.rank == 0 ? 3.0f : 0.0f), second(1 << 20, ctx.rank == 0 ? 4.0f : 0.0f);
    if (ctx.rank == 0) {
      auto a = comm->send_async(first.data(), first.size(), DataType::Float32, 1);
      auto b = comm->send_async(second.data(), second.size(), DataType::Float32, 1);
      comm->shutdown();
      RANK_CHECK(a->is_success() && b->is_success());
    } else {
      std::this_thread::sleep_for(300ms);
      comm->recv(first.data(), first.size(), DataType::Float32, 0);
      comm->recv(second.data(), second.size(), DataType::Float32, 0);
      RANK_CHECK(first.back() == 3.0f && second.back() == 4.0f);
      comm->shutdown();
    }
  }));
}

std::shared_ptr<Communicator> shm_group(RankContext& ctx) {
  CommunicatorOptions o;
  o.backend = "shm";
  return Communicator::create(ctx.store, ctx.rank, ctx.world, o);
}

// The root of a broadcast that rank 1 never makes: shutdown waits for it until its timeout and
// names rank 1. The destructor does the same without throwing, and logs what it found.
TEST(LastCallShm, ShutdownNamesAPeerThatNeverMadeTheLastCall) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto comm = shm_group(ctx);
    float x = 1;
    if (ctx.rank == 1) {
      ctx.store->wait({"done/0"}, 60s);
      return;
    }
    comm->broadcast(&x, 1, DataType::Float32, 0);
    auto msg = RANK_EXPECT_THROW(TimeoutError, comm->shutdown(500ms));
    RANK_CHECK(contains(msg, "rank 1 did not arrive") && contains(msg, "broadcast"), msg);
    ctx.store->set("done/0", "1");
  }));
}

TEST(LastCallShm, DestroyingAGroupLogsAMismatchInTheLastCall) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto comm = shm_group(ctx);
    float x = 1;
    if (ctx.rank == 1) {
      RANK_EXPECT_THROW(CollectiveMismatch, comm->all_reduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum));
      ctx.store->wait({"done/0"}, 60s);
      return;
    }
    comm->broadcast(&x, 1, DataType::Float32, 0);
    ::testing::internal::CaptureStderr();
    comm.reset();
    const std::string log = ::testing::internal::GetCapturedStderr();
    RANK_CHECK(contains(log, "rank 0: group 'world' destroyed after an unfinished call") && contains(log, "all_reduce"),
               log);
    ctx.store->set("done/0", "1");
  }));
}

INSTANTIATE_TEST_SUITE_P(Backends, LastCall, ::testing::ValuesIn(test_backends()), backend_param_name);

}  // namespace
}  // namespace chorus::test
