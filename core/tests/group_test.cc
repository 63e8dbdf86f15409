// Subgroups, async work and point-to-point.
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/core/settings.h"
#include "multiprocess.h"
#include "shm/algorithms.h"
#include "shm/peer_read.h"
#include "shm/shm_group.h"
#include "shm/waiter.h"

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
    options.shm.chunk_bytes = ctx.rank == 0 ? 4096 : 1 << 20;
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
    std::vector<int32_t> x(100000, ctx.rank + 1);
    comm->all_reduce(x.data(), x.data(), x.size(), DataType::Int32, ReduceOp::Sum);
    RANK_CHECK(x.front() == 6 && x.back() == 6);
  }));
}

// Note [Deep slots when ranks share cores]: with more ranks than cores a group's slots hold a few of
// rank 0's chunks, as long as all the slots stay within kDeepSlotsBytes; with a core for every
// rank, one.
TEST(ShmGroups, GroupsWithMoreRanksThanCoresGetDeepSlots) {
  auto slots = [](int world, size_t zeros_chunk, uint32_t depth) {
    expect_all_ok(run_ranks(world, [&](RankContext& ctx) {
      BackendOptions options;
      options.group_name = "deep-slots";
      options.deadline = Clock::now() + 30s;
      options.shm.chunk_bytes = ctx.rank == 0 ? zeros_chunk : 1 << 20;
      shm::ShmGroup g(*ctx.store, ctx.rank, ctx.world, options);
      RANK_CHECK(g.chunk_bytes() == zeros_chunk && g.slot_bytes() == depth * zeros_chunk, "W=", world, " on ",
                 shm::usable_cores(), " cores, rank 0's chunk ", zeros_chunk, ": chunk ", g.chunk_bytes(), ", slot ",
                 g.slot_bytes(), ", expected ", depth, " chunks");
    }));
  };
  const int cores = shm::usable_cores();
  slots(cores, 4096, 1);
  slots(cores + 1, 4096, shm::kMaxSlotDepth);
  const size_t most = shm::kDeepSlotsBytes / (2 * size_t(cores + 1));  // every slot of the group within it
  slots(cores + 1, most / 2 / 64 * 64, 2);                             // room for two chunks a slot
  slots(cores + 1, most * 2 / 64 * 64, 1);
}

// Note [Streaming into the slots]: rank 0's setting decides how the group stores large messages
// into the slots, and the others follow it from the first phase on; with nothing said, rank 0
// measures, and its first calls go every way in turn, the copies out streaming or not (Note
// [Streaming out with the slots]). Every combination gives the same results.
TEST(ShmGroups, RanksWithDifferentStreamSettingsUseRankZeros) {
  const std::optional<bool> choices[] = {std::nullopt, true, false};
  for (const auto& zero : choices)
    for (const auto& one : choices)
      expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
        CommunicatorOptions options;
        options.backend = "shm";
        options.shm.stream_slots = ctx.rank == 0 ? zero : one;
        auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
        const size_t count = (size_t(1) << 20) + 7;  // 4 MiB of f32 and up choose
        std::vector<float> x(count), y(count), b(count), all(2 * count);
        for (int call = 0; call < 10; ++call) {  // rank 0's measuring tries the four ways in its first calls
          for (size_t i = 0; i < count; ++i) x[i] = float((ctx.rank + 1) * int(i % 1000) + call);
          comm->all_reduce(x.data(), y.data(), count, DataType::Float32, ReduceOp::Sum);
          comm->all_reduce(x.data(), x.data(), count, DataType::Float32, ReduceOp::Sum);
          for (size_t i : {size_t(0), count / 2, count - 1}) {
            RANK_CHECK(y[i] == float(3 * int(i % 1000) + 2 * call), "all_reduce, call ", call);
            RANK_CHECK(x[i] == y[i], "all_reduce in place, call ", call);
          }
          for (size_t i = 0; i < count; ++i) b[i] = ctx.rank == 1 ? float(i % 977 + call) : -1.0f;
          comm->broadcast(b.data(), count, DataType::Float32, 1);
          RANK_CHECK(b[count - 1] == float((count - 1) % 977 + call), "broadcast, call ", call);
          comm->all_gather(b.data(), all.data(), count, DataType::Float32);
          RANK_CHECK(all[count - 1] == b[count - 1] && all[2 * count - 1] == b[count - 1], "all_gather, call ", call);
        }
      }));
}

// Note [Single-copy collectives]: middle-sized all_gathers write into the peers' outputs directly
// when every rank allows it (each rank's own setting; rank 0's "yes" makes every such call write,
// its silence makes it time them against the slots, call after call), and go through the slots,
// on every rank alike, as soon as one does not. Every way gives the same blocks, call after call,
// into one output or a buffer a block.
TEST(ShmGroups, SingleCopyAllGathersAreRightWhateverEachRankAllows) {
  using Said = std::optional<bool>;
  const std::pair<Said, Said> settings[] = {
      {true, true}, {false, true}, {true, false}, {std::nullopt, std::nullopt}, {std::nullopt, false}};
  for (const auto& [zero, one] : settings) {
    expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
      CommunicatorOptions options;
      options.backend = "shm";
      options.shm.single_copy = ctx.rank == 0 ? zero : one;
      auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
      const int me = comm->rank();
      auto value = [](int r, size_t i, int round) { return float(r * 1000003 + int(i % 65521) + round); };
      const int rounds = zero ? 3 : 40;  // timed: past the trials of every way
      for (int round = 0; round < rounds; ++round)
        for (size_t count : {size_t(4096) + 3, size_t(65536) + 5, size_t(262144) + 1, size_t(400000),
                             size_t(4 << 20) + 9}) {  // 16 KiB .. 16 MiB
          std::vector<float> in(count), out(2 * count, -1.0f);
          for (size_t i = 0; i < count; ++i) in[i] = value(me, i, round);
          comm->all_gather(in.data(), out.data(), count, DataType::Float32);
          for (int r = 0; r < 2; ++r)
            for (size_t i : {size_t(0), count / 2, count - 1})
              RANK_CHECK(out[size_t(r) * count + i] == value(r, i, round), "all_gather of ", count, ", block ", r);
          std::fill(out.begin(), out.end(), -1.0f);  // in place: the input is this rank's block
          std::copy(in.begin(), in.end(), out.begin() + std::ptrdiff_t(size_t(me) * count));
          comm->all_gather(out.data() + size_t(me) * count, out.data(), count, DataType::Float32);
          for (int r = 0; r < 2; ++r)
            RANK_CHECK(out[size_t(r) * count + count - 1] == value(r, count - 1, round), "in place, block ", r);
          const std::vector<size_t> counts = {count, count / 3};  // uneven
          std::vector<float> v(count + count / 3, -1.0f);
          comm->all_gather_v(in.data(), v.data(), counts, DataType::Float32);
          RANK_CHECK(v[count - 1] == value(0, count - 1, round) && v[count] == value(1, 0, round) &&
                         v.back() == value(1, count / 3 - 1, round),
                     "all_gather_v of ", count);
          std::vector<std::vector<float>> blocks(2, std::vector<float>(count, -1.0f));  // a buffer a block
          comm->all_gather_to(in.data(), {blocks[0].data(), blocks[1].data()}, count, DataType::Float32);
          for (int r = 0; r < 2; ++r)
            RANK_CHECK(blocks[size_t(r)][0] == value(r, 0, round) &&
                           blocks[size_t(r)][count - 1] == value(r, count - 1, round),
                       "all_gather_to of ", count, ", block ", r);
        }
    }));
  }
}

// Note [Single-copy collectives]: rank 0's setting decides whether a group tries single copies at
// all (the same answer on every rank, whatever theirs), and with nothing said, it does (timing them).
TEST(ShmGroups, RankZeroDecidesWhetherAGroupTriesSingleCopies) {
  const std::optional<bool> choices[] = {std::nullopt, true, false};
  auto said = [](const std::optional<bool>& c) { return !c ? "nothing" : *c ? "yes" : "no"; };
  for (const auto& zero : choices)
    for (const auto& one : choices) {
      expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
        BackendOptions options;
        options.group_name = "single-copy";
        options.deadline = Clock::now() + 30s;
        options.shm.single_copy = ctx.rank == 0 ? zero : one;
        shm::ShmGroup g(*ctx.store, ctx.rank, ctx.world, options);
        const bool tries = zero.value_or(true) && shm::usable_cores() >= 2;
        RANK_CHECK(g.single_copy(OpKind::AllGather, 1 << 20) == tries, "rank 0 said ", said(zero), ", rank 1 ",
                   said(one));
        RANK_CHECK(!g.single_copy(OpKind::Broadcast, 1 << 20) && !g.single_copy(OpKind::AllGather, 64 << 20));
      }));
    }
}

TEST(ShmGroups, ReadingAPeerFailsCleanlyWhereTheKernelSaysNo) {
  const uint64_t word = 0x1234567890abcdefull;
  uint64_t got = 0;
  EXPECT_TRUE(shm::read_peer(getpid(), &word, &got, sizeof got));
  EXPECT_EQ(got, word);
  EXPECT_FALSE(shm::read_peer(getpid(), nullptr, &got, sizeof got));  // not mapped
  EXPECT_FALSE(shm::read_peer(-1, &word, &got, sizeof got));          // no such process
}

TEST(ShmGroups, WritingIntoAPeerFailsCleanlyWhereTheKernelSaysNo) {
  const uint64_t word = 0x1234567890abcdefull;
  uint64_t put = 0;
  EXPECT_TRUE(shm::write_peer(getpid(), &put, &word, sizeof word));
  EXPECT_EQ(put, word);
  EXPECT_FALSE(shm::write_peer(getpid(), nullptr, &word, sizeof word));          // not mapped
  EXPECT_FALSE(shm::write_peer(getpid(), const_cast<char*>("text"), &word, 4));  // read-only
  EXPECT_FALSE(shm::write_peer(-1, &put, &word, sizeof word));                   // no such process
}

// Note [Owed waits]: a rank that reads nothing after its call's last phase posts it and leaves;
// its next call waits for that phase before anything else, and names a peer that failed in the
// call the wait was owed for.
// Note [A staging area for large broadcasts]: a broadcast that outgrows the ring of slots stages
// its chunks in the group's staging area once rank 0 has reserved it, and goes through the slots
// alone where there is none or /dev/shm has no room for it. Each call's root has a CPU to itself and
// its readers share the other one with a busy thread each, so the root finds them behind and goes
// on into the staging area: at once with more ranks than cores, after waiting for a slot once where
// every rank has a core (Note [Staging for readers away]). Through tiny slots, from every root, back
// to back, with a call between that uses the slots; messages of more chunks than the table of places
// has entries, and a staging area so small that the chunks go round it many times. Every byte checked.
TEST(ShmGroups, ABroadcastThatOutgrowsTheSlotsStagesItsMessage) {
  struct statvfs fs {};
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0);
  const size_t shm_size = size_t(fs.f_blocks) * fs.f_frsize;
  struct Case {
    size_t stage_bytes;
    bool ready;  // whether rank 0 can reserve it
  };
  std::vector<Case> cases = {{size_t(64) << 20, true}, {8192, true}, {0, false}};
  if (shm_size != 0) cases.push_back({shm_size + (1 << 20), false});  // more than /dev/shm holds
  for (int world : {3, 2})
    for (const Case& the : cases)
      expect_all_ok(run_ranks(world, [&](RankContext& ctx) {
        cpu_set_t allowed;
        RANK_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
        std::vector<int> cpus;
        for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu)
          if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
        std::atomic<bool> done{false};
        std::thread busy([&] {  // on the readers' CPU
          if (cpus.size() < 2) return;
          bind_to_cpu(cpus[1]);
          while (!done.load(std::memory_order_relaxed)) {
          }
        });
        struct Stop {
          std::atomic<bool>& done;
          std::thread& busy;
          ~Stop() {
            done = true;
            busy.join();
          }
        } stop{done, busy};
        BackendOptions options;
        options.group_name = "staged";
        options.deadline = Clock::now() + 60s;
        options.shm.chunk_bytes = 512;
        options.shm.stage_bytes = the.stage_bytes;
        shm::ShmGroup g(*ctx.store, ctx.rank, ctx.world, options);
        auto run = [&](OpKind kind, void* buf, size_t count, int root) {
          Call c{.kind = kind, .dtype = DataType::UInt8, .root = root, .count = count, .out = buf};
          c.start = Clock::now();
          c.deadline = c.start + 60s;
          if (cpus.size() >= 2) bind_to_cpu(ctx.rank == root ? cpus[0] : cpus[1]);
          g.start(c);
          if (kind == OpKind::Broadcast) return shm::broadcast(g, c);
          c.in = buf;
          shm::all_reduce(g, c);
        };
        // Every chunk differs from every other: a reader that copies the wrong place out is caught.
        auto byte = [](int root, int call, size_t i) {
          return uint8_t(((uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 56) + uint64_t(root) * 31 + uint64_t(call) * 13);
        };
        // From each root a message of 40 chunks, then one of 1,200 and more, back to back: the next
        // call may find the readers still copying the last one out. An all_reduce through the slots
        // after the first root's.
        int call = 0;
        for (int root = 0; root < ctx.world; ++root)
          for (size_t count : {size_t(20000), (size_t(600) << 10) + 13}) {
            std::vector<uint8_t> buf(count);
            for (size_t i = 0; i < count; ++i) buf[i] = ctx.rank == root ? byte(root, call, i) : 0xEE;
            run(OpKind::Broadcast, buf.data(), count, root);
            for (size_t i = 0; i < count; ++i)
              RANK_CHECK(buf[i] == byte(root, call, i), "stage of ", the.stage_bytes, " bytes: broadcast of ", count,
                         " from rank ", root, ", byte ", i, " is ", int(buf[i]));
            ++call;
            if (root != 0 || count == 20000) continue;
            std::vector<uint8_t> ones(4099, 1);
            run(OpKind::AllReduce, ones.data(), ones.size(), 0);
            RANK_CHECK(ones.front() == world && ones.back() == world, "all_reduce after a broadcast from rank ", root);
          }
        RANK_CHECK(g.stage_ready() == the.ready, "W=", world, ", stage of ", the.stage_bytes, " bytes: ready ",
                   g.stage_ready());
        g.finish(Clock::now() + 30s);
      }));
}

TEST(ShmGroups, AnOwedWaitIsPaidByTheNextCallAndNamesWhoFailedInTheLast) {
  expect_all_ok(run_ranks(2, [](RankContext& ctx) {
    BackendOptions options;
    options.group_name = "owed";
    options.deadline = Clock::now() + 30s;
    shm::ShmGroup g(*ctx.store, ctx.rank, ctx.world, options);
    auto call = [](OpKind kind) {
      Call c{.kind = kind, .dtype = DataType::Float32, .count = 1000};
      c.start = Clock::now();
      c.deadline = c.start + 20s;
      return c;
    };
    g.start(call(OpKind::Broadcast));
    g.sync();                   // every rank is in the call, and the calls were compared
    if (ctx.rank == 1) return;  // leaves without posting the call's last phase
    g.post_last();              // does not wait for rank 1
    auto msg = RANK_EXPECT_THROW(PeerFailure, g.start(call(OpKind::Barrier)));
    RANK_CHECK(msg.find("rank 1 left group 'owed'") != std::string::npos &&
                   msg.find("broadcast") != std::string::npos && msg.find("call #1") != std::string::npos,
               msg);
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

// B is queued behind A, which runs on the executor until released 50 ms later; B (a barrier,
// submitted with `b_options`, then waited for) must not start first.
void expect_queued_behind_a_running_one(Communicator& comm, AsyncOptions b_options) {
  std::atomic<bool> release{false};
  std::vector<char> order;
  std::mutex order_mu;
  auto a = comm.submit([&] {
    while (!release) std::this_thread::sleep_for(1ms);
    std::lock_guard<std::mutex> lock(order_mu);
    order.push_back('A');
  });
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    release = true;
  });
  auto b = comm.submit(
      [&] {
        comm.barrier();
        std::lock_guard<std::mutex> lock(order_mu);
        order.push_back('B');
      },
      std::move(b_options));
  b->wait();
  releaser.join();
  RANK_CHECK(a->is_completed() && b->is_success() && order == std::vector<char>({'A', 'B'}));
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

    // Order: B's waiter must not start it ahead of A.
    expect_queued_behind_a_running_one(comm, {});

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

// recv_any: each message comes from whichever rank sends first, and names it; large messages too
// (the rest of a message comes from the same rank); a receive issued before it from one peer
// gets that peer's first message.
TEST_P(PointToPoint, ReceiveFromAnyRank) {
  expect_all_ok(run_group(
      3,
      [](Communicator& comm) {
        const int me = comm.rank(), n = comm.size();
        for (size_t count : {size_t(1), size_t(3000000)}) {
          if (me != 0) {
            std::vector<int32_t> out(count, me);
            comm.send(out.data(), count, DataType::Int32, 0, 3);
          } else {
            std::vector<int> from;
            for (int k = 1; k < n; ++k) {
              std::vector<int32_t> in(count, -1);
              const int src = comm.recv_any(in.data(), count, DataType::Int32, 3);
              RANK_CHECK(src > 0 && src < n && in.front() == src && in.back() == src, "from ", src);
              from.push_back(src);
            }
            std::sort(from.begin(), from.end());
            RANK_CHECK(from == std::vector<int>({1, 2}));
          }
          comm.barrier();
        }
        // Rank 2 sends twice, rank 1 once. Rank 0 receives from 2 first, then asynchronously from
        // any rank twice: it must get rank 2's second message and rank 1's, never rank 2's first.
        if (me == 2) {
          int64_t a = 20, b = 21;
          comm.send(&a, 1, DataType::Int64, 0);
          comm.send(&b, 1, DataType::Int64, 0);
        } else if (me == 1) {
          int64_t c = 10;
          comm.send(&c, 1, DataType::Int64, 0);
        } else {
          int64_t first = 0, x = 0, y = 0;
          int sx = -1, sy = -1;
          auto w0 = comm.recv_async(&first, 1, DataType::Int64, 2);
          auto wx = comm.recv_any_async(&x, 1, DataType::Int64, &sx);
          auto wy = comm.recv_any_async(&y, 1, DataType::Int64, &sy);
          w0->wait();
          wx->wait();
          wy->wait();
          RANK_CHECK(first == 20, first);
          RANK_CHECK((sx == 1 && x == 10 && sy == 2 && y == 21) || (sx == 2 && x == 21 && sy == 1 && y == 10), sx, " ",
                     x, " ", sy, " ", y);
        }
        comm.barrier();
      },
      options()));
}

TEST_P(PointToPoint, ReceiveFromAnyRankNamesAPeerThatDies) {
  if (GetParam() == "mpi") GTEST_SKIP() << "mpirun ends the job when a rank dies: tests/mpi_rank_killed.sh";
  auto results = run_ranks(2, [&](RankContext& ctx) {
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options(20000ms));
    comm->barrier();
    if (ctx.rank == 1) kill(getpid(), SIGKILL);  // dies without a word
    int32_t x = 0;
    auto msg = RANK_EXPECT_THROW(PeerFailure, comm->recv_any(&x, 1, DataType::Int32));
    RANK_CHECK(msg.find("rank 1") != std::string::npos, msg);
  });
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].report;
}

// Note [One Work per call]: the handle given is the Work returned and finished, and `then` runs
// before it finishes.
TEST_P(Async, TheHandleGivenIsTheQueuedWork) {
  expect_all_ok(run_group(
      2,
      [](Communicator& comm) {
        struct Mine : Work {};
        auto mine = std::make_shared<Mine>();
        std::atomic<bool> then_saw_unfinished{false};
        int64_t x = comm.rank() + 1;
        auto w = comm.submit([&] { comm.all_reduce(&x, &x, 1, DataType::Int64, ReduceOp::Sum); },
                             {.handle = mine, .then = [&] { then_saw_unfinished = !mine->is_completed(); }});
        RANK_CHECK(w.get() == mine.get());
        w->wait();
        RANK_CHECK(then_saw_unfinished && x == 3);
        int64_t y = 7;
        auto mine2 = std::make_shared<Mine>();
        auto s = comm.rank() == 0 ? comm.send_async(&y, 1, DataType::Int64, 1, 0, {}, {.handle = mine2})
                                  : comm.recv_async(&y, 1, DataType::Int64, 0, 0, {}, {.handle = mine2});
        RANK_CHECK(s.get() == mine2.get());
        s->wait();
        RANK_CHECK(y == 7);
      },
      options()));
}

// AsyncOptions::on_caller: submit returns the work finished, its error kept in the work; the body
// ran on the calling thread when nothing was queued before it, and never ahead of what was.
TEST_P(Async, OnCallerReturnsFinishedInOrderAndKeepsTheError) {
  expect_all_ok(run_group(
      2,
      [](Communicator& comm) {
        std::thread::id ran_on;
        int64_t x = comm.rank() + 1;
        auto first = comm.submit(
            [&] {
              ran_on = std::this_thread::get_id();
              comm.all_reduce(&x, &x, 1, DataType::Int64, ReduceOp::Sum);
            },
            {.on_caller = true});
        RANK_CHECK(first->is_completed() && first->is_success() && x == 3);
        RANK_CHECK(ran_on == std::this_thread::get_id());

        expect_queued_behind_a_running_one(comm, {.on_caller = true});

        auto bad = comm.submit([] { throw InvalidArgument("a body that fails on purpose"); }, {.on_caller = true});
        RANK_CHECK(bad->is_completed() && !bad->is_success());
        auto msg = RANK_EXPECT_THROW(InvalidArgument, bad->wait());
        RANK_CHECK(msg.find("on purpose") != std::string::npos, msg);

        // Inside a body, it runs inline as the body's blocking calls do.
        int64_t y = 1;
        auto outer = comm.submit([&] {
          auto inner =
              comm.submit([&] { comm.all_reduce(&y, &y, 1, DataType::Int64, ReduceOp::Sum); }, {.on_caller = true});
          RANK_CHECK(inner->is_completed() && y == 2);
        });
        outer->wait();
        comm.barrier();
      },
      options()));
}

// all_gather_to: every rank's block into a buffer of its own, in place too.
TEST_P(Groups, AllGatherIntoSeparateBuffers) {
  expect_all_ok(run_group(
      3,
      [](Communicator& comm) {
        const int me = comm.rank(), n = comm.size();
        for (size_t count : {size_t(0), size_t(3), size_t(700000)}) {
          std::vector<std::vector<float>> blocks(size_t(n), std::vector<float>(count, -1.0f));
          std::vector<void*> outs;
          for (auto& b : blocks) outs.push_back(b.data());
          std::vector<float> in(count, float(me));
          comm.all_gather_to(in.data(), outs, count, DataType::Float32);
          for (int r = 0; r < n; ++r)
            RANK_CHECK(count == 0 || (blocks[size_t(r)].front() == float(r) && blocks[size_t(r)].back() == float(r)),
                       "block ", r);
          std::fill(blocks[size_t(me)].begin(), blocks[size_t(me)].end(), float(me) * 2);  // in place
          comm.all_gather_to(blocks[size_t(me)].data(), outs, count, DataType::Float32);
          for (int r = 0; r < n; ++r) RANK_CHECK(count == 0 || blocks[size_t(r)].back() == float(r) * 2);
        }
        std::vector<float> a(4), b(4), in(4);
        std::vector<void*> overlapping = {a.data(), a.data() + 1, b.data()};
        auto msg = RANK_EXPECT_THROW(InvalidArgument, comm.all_gather_to(in.data(), overlapping, 4, DataType::Float32));
        RANK_CHECK(msg.find("overlap") != std::string::npos, msg);
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
