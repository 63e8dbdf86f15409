// Subgroups, async work and point-to-point.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "multiprocess.h"

namespace chorus::test {
namespace {

using namespace std::chrono_literals;

class Groups : public BackendTest {};
class Async : public BackendTest {};
class PointToPoint : public BackendTest {};

TEST_P(Groups, OverlappingSubgroupsLiveTogether) {
  expect_all_ok(run_group(
      4,
      [](Communicator& world) {
        auto a = world.split({0, 1});
        auto b = world.split({1, 2});
        auto c = world.split({3, 0});  // order gives the new ranks
        const int me = world.rank();
        RANK_CHECK((a != nullptr) == (me == 0 || me == 1));
        RANK_CHECK((b != nullptr) == (me == 1 || me == 2));
        RANK_CHECK((c != nullptr) == (me == 3 || me == 0));
        if (c) RANK_CHECK(c->rank() == (me == 3 ? 0 : 1) && c->size() == 2);
        for (int round = 0; round < 3; ++round) {
          for (auto* g : {a.get(), b.get(), c.get()}) {
            if (!g) continue;
            int64_t x = 10 * (me + 1) + round;
            g->all_reduce(&x, &x, 1, DataType::Int64, ReduceOp::Sum);
            int64_t want = 0;
            if (g == a.get()) want = 10 + 20 + 2 * round;
            if (g == b.get()) want = 20 + 30 + 2 * round;
            if (g == c.get()) want = 40 + 10 + 2 * round;
            RANK_CHECK(x == want, "subgroup sum ", x, " want ", want);
          }
          int64_t all = me;
          world.all_reduce(&all, &all, 1, DataType::Int64, ReduceOp::Sum);
          RANK_CHECK(all == 6);
        }
        auto msg = RANK_EXPECT_THROW(InvalidArgument, world.split({0, 0}));
        RANK_CHECK(msg.find("listed twice") != std::string::npos || me != 0, msg);
      },
      options()));
}

TEST_P(Groups, ManyCreatedAndDestroyedInTurn) {
  expect_all_ok(run_ranks(3, [&](RankContext& ctx) {
    for (int i = 0; i < 20; ++i) {
      auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options());
      int32_t x = i;
      comm->all_reduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
      RANK_CHECK(x == 3 * i);
    }
  }));
}

TEST(ShmGroups, RanksWithDifferentSlotSettingsUseRankZeros) {
  expect_all_ok(run_ranks(3, [](RankContext& ctx) {
    CommunicatorOptions options;
    options.shm_chunk_bytes = ctx.rank == 0 ? 4096 : 1 << 20;
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
    std::vector<int32_t> x(100000, ctx.rank + 1);
    comm->all_reduce(x.data(), x.data(), x.size(), DataType::Int32, ReduceOp::Sum);
    RANK_CHECK(x.front() == 6 && x.back() == 6);
  }));
}

TEST_P(Async, WorkCompletesInOrderAndReportsErrors) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto owned = Communicator::create(ctx.store, ctx.rank, ctx.world, options(1500ms));
    Communicator& comm = *owned;
    std::vector<float> a(100000, float(comm.rank() + 1)), b(1000, 0.0f);
    if (comm.rank() == 0) std::fill(b.begin(), b.end(), 7.0f);
    auto w1 = comm.submit([&] { comm.all_reduce(a.data(), a.data(), a.size(), DataType::Float32, ReduceOp::Sum); });
    auto w2 = comm.submit([&] { comm.broadcast(b.data(), b.size(), DataType::Float32, 0); });
    w2->wait();
    RANK_CHECK(w1->is_completed() && w1->is_success());
    w1->wait();
    RANK_CHECK(a[99999] == 3.0f && b[999] == 7.0f);
    RANK_CHECK(w1->exception() == nullptr);
    comm.barrier();  // a blocking call after async ones

    if (comm.rank() == 1) {  // never joins the next barrier; stays alive until rank 0 is done
      ctx.store->wait({"done/0"}, 60s);
      return;
    }
    auto w = comm.submit([&] { comm.barrier(); });
    RANK_EXPECT_THROW(TimeoutError, w->wait(50ms));  // Work::wait's own limit
    RANK_CHECK(!w->is_completed());
    auto msg = RANK_EXPECT_THROW(TimeoutError, w->wait());  // the barrier's deadline
    RANK_CHECK(msg.find("rank 1") != std::string::npos, msg);
    RANK_CHECK(w->is_completed() && !w->is_success() && w->exception() != nullptr);
    ctx.store->set("done/0", "1");
  }));
}

// Note [Running on the waiter]: a wait without a timeout runs a queued collective on the waiting
// thread when it is next and the executor is idle; never ahead of one that runs or is queued
// before it; its error reaches the waiter.
TEST_P(Async, AWaiterRunsTheNextQueuedCollectiveItselfAndNeverOutOfOrder) {
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    auto owned = Communicator::create(ctx.store, ctx.rank, ctx.world, options(5000ms));
    Communicator& comm = *owned;
    const auto me = std::this_thread::get_id();
    int on_waiter = 0;
    for (int i = 0; i < 200; ++i) {
      std::thread::id ran_on;
      int64_t x = comm.rank() + i;
      auto w = comm.submit([&] {
        ran_on = std::this_thread::get_id();
        comm.all_reduce(&x, &x, 1, DataType::Int64, ReduceOp::Sum);  // its own drain must not wait for itself
      });
      w->wait();
      RANK_CHECK(x == 1 + 2 * i, "iteration ", i, ": ", x);
      on_waiter += ran_on == me;
    }
    RANK_CHECK(on_waiter > 0, "no wait ran its collective itself in 200 tries");

    // Order: B is queued behind A, which runs on the executor until released; B's waiter must
    // not start it first.
    std::atomic<bool> release{false};
    std::vector<char> order;
    std::mutex order_mu;
    auto a = comm.submit([&] {
      while (!release) std::this_thread::sleep_for(1ms);
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back('A');
    });
    auto b = comm.submit([&] {
      comm.barrier();
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back('B');
    });
    std::thread releaser([&] {
      std::this_thread::sleep_for(50ms);
      release = true;
    });
    b->wait();
    releaser.join();
    RANK_CHECK(a->is_completed() && order == std::vector<char>({'A', 'B'}));

    // An error thrown by a body the waiter ran reaches it, and the communicator goes on.
    auto bad = comm.submit([] { throw InvalidArgument("a body that fails on purpose"); });
    auto msg = RANK_EXPECT_THROW(InvalidArgument, bad->wait());
    RANK_CHECK(msg.find("on purpose") != std::string::npos, msg);
    comm.barrier();
  }));
}

TEST_P(PointToPoint, RingOfEverySize) {
  expect_all_ok(run_group(
      3,
      [](Communicator& comm) {
        const int me = comm.rank(), n = comm.size();
        for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(3000000)}) {
          std::vector<int32_t> out(count), in(count + 1, -1);
          for (size_t i = 0; i < count; ++i) out[i] = int32_t(i * 7 + size_t(me));
          const int next = (me + 1) % n, prev = (me + n - 1) % n;
          // Even ranks send first; the ring's odd length makes one pair both send: async covers it.
          auto w = comm.send_async(out.data(), count, DataType::Int32, next, 5);
          comm.recv(in.data(), count, DataType::Int32, prev, 5);
          w->wait();
          for (size_t i = 0; i < count; ++i) RANK_CHECK(in[i] == int32_t(i * 7 + size_t(prev)), "at ", i);
          comm.barrier();
        }
      },
      options()));
}

// The harness itself, in both of its modes (forked ranks, and processes of an mpirun job): a rank
// that throws is reported with its message, the others as fine.
class Harness : public BackendTest {};
TEST_P(Harness, ARankThatThrowsIsReportedWithItsMessage) {
  auto results = run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank == 1) throw std::runtime_error("rank 1 gave up on purpose");
  });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].report;
  EXPECT_EQ(results[1].exit_code, 1);
  EXPECT_EQ(results[1].report, "rank 1 gave up on purpose");
}

INSTANTIATE_TEST_SUITE_P(Backends, Harness, ::testing::ValuesIn(test_backends()), backend_param_name);
INSTANTIATE_TEST_SUITE_P(Backends, Groups, ::testing::ValuesIn(test_backends()), backend_param_name);
INSTANTIATE_TEST_SUITE_P(Backends, Async, ::testing::ValuesIn(test_backends()), backend_param_name);
INSTANTIATE_TEST_SUITE_P(Backends, PointToPoint, ::testing::ValuesIn(test_backends()), backend_param_name);

}  // namespace
}  // namespace chorus::test
