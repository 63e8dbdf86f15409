// How ranks wait and where they run when they share the cores: the spin policy a group sets, the
// ranks it counts against the cores, and the placement of ranks that outnumber them.
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "chorus/core/settings.h"
#include "multiprocess.h"
#include "shm/shm_group.h"
#include "shm/waiter.h"

namespace chorus::test {
namespace {

using namespace std::chrono_literals;

// Note [Ranks sharing the cores]: a group counts its ranks on this machine's kernel, and a wait
// counts the most any group saw against the cores, though its own group be smaller.
TEST(ShmGroups, WaitsCountEveryRankOnThisMachineAgainstItsCores) {
  if (settings().shm_spin_us) GTEST_SKIP() << "CHORUS_SHM_SPIN_US is set";
  const int crowd = shm::usable_cores() + 1;
  expect_all_ok(run_group(crowd, [crowd](Communicator& world) {
    // Not oversubscribed by itself, a group of one spins, unless a group saw more ranks here
    // than cores: this one did, all of them on this kernel.
    RANK_CHECK(world.size() == crowd, "world of ", world.size());
    // Nor may it spin where no rank of its own shares its CPU: the job's other ranks may.
    const auto p = shm::SpinPolicy::for_group(1);
    RANK_CHECK(p.crowded && !p.spin_alone && p.yield_for == std::chrono::milliseconds(1), "a wait ",
               p.crowded ? "counts" : "does not count", " itself crowded, ", p.spin_alone ? "spins" : "does not spin",
               " alone and yields ", p.yield_for.count(), " ns with ", crowd, " ranks on ", crowd - 1, " cores");
    const auto whole = shm::SpinPolicy::for_group(crowd);
    RANK_CHECK(whole.crowded && whole.spin_alone, "a group of all ", crowd, " ranks on ", crowd - 1, " cores ",
               whole.spin_alone ? "spins" : "does not spin", " where it is alone");
  }));
}

// Note [Ranks sharing the cores], Note [Spinning on a core of one's own]: ranks bound to a CPU each
// count the CPUs of them all, so they know they are not crowding one core, and spin.
TEST(ShmGroups, RanksBoundToACoreEachCountTheirCoresTogether) {
  if (settings().shm_spin_us) GTEST_SKIP() << "CHORUS_SHM_SPIN_US is set";
  if (shm::usable_cores() < 2) GTEST_SKIP() << "one CPU";
  const std::vector<int> cpus = shm::parse_cpu_list(shm::usable_cpu_list());
  ASSERT_EQ(int(cpus.size()), shm::usable_cores()) << shm::usable_cpu_list();
  expect_all_ok(run_ranks(2, [&](RankContext& ctx) {
    bind_to_cpu(cpus[size_t(ctx.rank)]);
    RANK_CHECK(shm::usable_cores() == 1 && shm::usable_cpu_list() == std::to_string(cpus[size_t(ctx.rank)]),
               "bound to ", shm::usable_cpu_list());
    CommunicatorOptions options;
    options.backend = "shm";
    auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
    RANK_CHECK(shm::job_cores() == 2, "the two ranks have ", shm::job_cores(), " CPUs between them");
    const auto p = shm::SpinPolicy::for_group(2);
    RANK_CHECK(p.spin_for == std::chrono::milliseconds(2), "a wait spins ", p.spin_for.count(), " ns");
    float x = float(ctx.rank + 1);
    comm->all_reduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
    RANK_CHECK(x == 3.0f, "sum ", x);
  }));
}

// This rank bound to `cpu` (-1: not bound, and so placed) in a world of the ranks (which notes them
// against the cores), and a group of the same ranks in a call, after which every rank posted once
// from its CPU.
struct BoundRanks {
  BoundRanks(RankContext& ctx, int cpu)
      : world((cpu >= 0 ? bind_to_cpu(cpu) : void(),
               Communicator::create(ctx.store, ctx.rank, ctx.world, shm_options()))),
        group(*ctx.store, ctx.rank, ctx.world, group_options()) {
    Call barrier{};  // a call's waits need its deadline
    barrier.start = Clock::now();
    barrier.deadline = barrier.start + 30s;
    group.start(barrier);
    group.sync();
  }
  static CommunicatorOptions shm_options() {
    CommunicatorOptions options;
    options.backend = "shm";
    return options;
  }
  static BackendOptions group_options() {
    BackendOptions options;
    options.group_name = "bound";
    options.deadline = Clock::now() + 30s;
    return options;
  }
  std::shared_ptr<Communicator> world;
  shm::ShmGroup group;
};

// Note [A rank alone beside busy cores]: with more ranks than cores, a rank that no rank of its group
// shares a CPU with may spin on its peers; the ranks that share one never do.
TEST(ShmGroups, OnlyARankAloneOnItsCpuSpinsWhenRanksOutnumberTheCores) {
  if (settings().shm_spin_us) GTEST_SKIP() << "CHORUS_SHM_SPIN_US is set";
  if (shm::usable_cores() < 2) GTEST_SKIP() << "one CPU";
  const std::vector<int> cpus = shm::parse_cpu_list(shm::usable_cpu_list());
  expect_all_ok(run_ranks(3, [&](RankContext& ctx) {
    const int cpu = cpus[ctx.rank == 2 ? 1 : 0];  // ranks 0 and 1 share a CPU, rank 2 has one
    BoundRanks bound(ctx, cpu);
    shm::ShmGroup& g = bound.group;
    const bool alone = ctx.rank == 2;
    for (int peer : {-1, (ctx.rank + 1) % 3})
      RANK_CHECK(g.may_spin_for(peer) == alone, "a wait on ", peer < 0 ? "any rank" : "rank " + std::to_string(peer),
                 alone ? " does not spin, alone on CPU " : " spins beside another rank on CPU ", cpu);
    g.sync();  // no rank leaves while another still reads its CPU
  }));
}

// Note [Evening out a long call]: a rank on a CPU with two fewer of its group's ranks than another
// yields briefly in a long call; with the ranks spread evenly, none does.
TEST(ShmGroups, OnlyRanksOnAnEmptierCpuYieldBrieflyToEvenOutALongCall) {
  if (settings().shm_spin_us) GTEST_SKIP() << "CHORUS_SHM_SPIN_US is set";
  if (shm::usable_cores() != 2) GTEST_SKIP() << "not 2 CPUs";
  const std::vector<int> cpus = shm::parse_cpu_list(shm::usable_cpu_list());
  expect_all_ok(run_ranks(4, [&](RankContext& ctx) {
    BoundRanks bound(ctx, cpus[ctx.rank == 3 ? 1 : 0]);  // three ranks on one CPU, one on the other
    shm::ShmGroup& g = bound.group;
    RANK_CHECK(g.on_emptier_cpu() == (ctx.rank == 3), "3 ranks on CPU ", cpus[0], " and 1 on CPU ", cpus[1],
               ": this rank ", ctx.rank == 3 ? "does not count its CPU emptier" : "counts its CPU emptier");
    g.sync();  // no rank moves while another still counts
    bind_to_cpu(cpus[ctx.rank >= 2 ? 1 : 0]);
    g.sync();  // posted again, from its new CPU
    RANK_CHECK(!g.on_emptier_cpu(), "2 ranks on each CPU: rank ", ctx.rank, " counts its CPU emptier");
    g.sync();
    const auto brief = shm::SpinPolicy::for_group(4).to_even_out();
    RANK_CHECK(brief.yield_for == 100us, "on an emptier CPU a wait yields ", brief.yield_for.count(), " ns");
  }));
}

// Note [Keeping the ranks even]: where the group's ranks are spread unevenly over the CPUs, a rank
// off its place moves onto it, unless more threads are runnable than the group has ranks, and
// checks again twice as many calls later; spread evenly, the next check comes kEvenEvery calls later
// again. The ranks stay bound while they count, or the scheduler might move them under the test
// (as it does beside other tests), and the test says how many threads are runnable (others may be).
TEST(ShmGroups, RanksSpreadUnevenlyMoveBackOntoTheirPlaces) {
  if (shm::usable_cores() != 2) GTEST_SKIP() << "not 2 CPUs";
  if (shm::bind_to() == "none") GTEST_SKIP() << "CHORUS_BIND_TO=none";
  const std::vector<int> cpus = shm::parse_cpu_list(shm::usable_cpu_list());
  expect_all_ok(run_ranks(4, [&](RankContext& ctx) {
    BoundRanks placed(ctx, -1);  // in blocks: ranks 0 and 1 on the first CPU, 2 and 3 on the second
    shm::ShmGroup& g = placed.group;
    const int place = cpus[size_t(ctx.rank / 2)];
    RANK_CHECK(shm::placed() && g.place() == place, "rank ", ctx.rank, " of 4 ", shm::placed() ? "" : "not ",
               "placed, its place CPU ", g.place());
    RANK_CHECK(g.next_even_check() == shm::ShmGroup::kEvenEvery, "first check at call ", g.next_even_check());
    cpu_set_t all;
    RANK_CHECK(sched_getaffinity(0, sizeof(all), &all) == 0, "no affinity");
    // A rank stores its CPU after its phase (Note [Publish the phase first]): seen by the next phase.
    auto run_on = [&](int cpu) {
      bind_to_cpu(cpu);
      g.sync();
      g.sync();
    };
    int (*none_but_the_ranks)() = [] { return 4; };  // runnable threads, as keep_even asks
    int (*one_more)() = [] { return 5; };
    const int crowded = cpus[ctx.rank == 3 ? 1 : 0];
    run_on(crowded);  // three ranks on one CPU, rank 2 off its place
    RANK_CHECK(g.spread_unevenly(), "3 ranks on CPU ", cpus[0], " and 1 on CPU ", cpus[1], " count as even");
    g.sync();  // a rank posts from where it runs: each sync keeps the next step's counting from another's move
    if (ctx.rank != 2) {  // on their places (and bound: the scheduler keeps them there)
      RANK_CHECK(!g.keep_even(none_but_the_ranks), "rank ", ctx.rank, " moved from CPU ", crowded, ", its place");
      RANK_CHECK(g.next_even_check() == 1 + 2 * shm::ShmGroup::kEvenEvery, "next check at call ", g.next_even_check());
    }
    g.sync();
    if (ctx.rank == 2) {  // free to move, it moves back, unless the scheduler moved it first: then again
      RANK_CHECK(sched_setaffinity(0, sizeof(all), &all) == 0, "not let go");
      RANK_CHECK(!g.keep_even(one_more), "rank 2 moved while a fifth thread was runnable");
      bool moved = false;
      for (int tries = 0; tries < 100 && !moved; ++tries) {
        bind_to_cpu(crowded);
        RANK_CHECK(sched_setaffinity(0, sizeof(all), &all) == 0, "not let go");
        moved = g.keep_even(none_but_the_ranks);
      }
      RANK_CHECK(moved, "rank 2 never moved back onto CPU ", place, " from CPU ", crowded);
    }
    g.sync();
    run_on(cpus[size_t(ctx.rank % 2)]);  // two and two, ranks 1 and 2 off their places
    RANK_CHECK(!g.spread_unevenly(), "2 ranks on each CPU count as uneven");
    g.keep_even(none_but_the_ranks);
    RANK_CHECK(g.next_even_check() == 1 + shm::ShmGroup::kEvenEvery, "spread evenly, rank ", ctx.rank,
               " checks next at call ", g.next_even_check());
    g.sync();
  }));
}

TEST(ShmGroups, RunnableThreadsCountThisOne) {
  const int runnable = shm::runnable_now();
  EXPECT_GE(runnable, 1) << "/proc/loadavg: " << runnable << " runnable";
}

TEST(ShmGroups, CpuListsReadBack) {
  EXPECT_EQ(shm::parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(shm::parse_cpu_list(""), std::vector<int>{});
  EXPECT_EQ(shm::parse_cpu_list("x,2"), std::vector<int>{2});  // what is not a range adds nothing
  EXPECT_EQ(shm::parse_cpu_list("-1"), std::vector<int>{});    // nor a negative CPU
  EXPECT_EQ(shm::parse_cpu_list(shm::usable_cpu_list()).size(), size_t(shm::usable_cores()));
}

// Note [Ranks placed, not bound]: a rank moves onto its share of the CPUs, consecutive ranks
// together, and may run on all of them again; bound to one CPU, or under CHORUS_BIND_TO=none, it
// stays where it is. A group of more ranks than cores, each placed as it is made, leaves every rank
// free to run on every CPU.
TEST(ShmGroups, RanksArePlacedInBlocksAndNotBound) {
  if (shm::usable_cores() < 2) GTEST_SKIP() << "one CPU";
  const std::string all = shm::usable_cpu_list();
  const std::vector<int> cpus = shm::parse_cpu_list(all);
  const int n = int(cpus.size());
  for (int ranks : {n, 2 * n, 2 * n + 1}) {
    std::vector<int> on;   // where each rank went
    std::vector<long> at;  // and that CPU's place among the usable ones (cpus.size(): not one of them)
    for (int k = 0; k < ranks; ++k) {
      on.push_back(shm::place_in_blocks(k, ranks));
      at.push_back(std::find(cpus.begin(), cpus.end(), on.back()) - cpus.begin());
      EXPECT_EQ(shm::usable_cpu_list(), all) << "placed, then bound";
    }
    EXPECT_EQ(on.front(), cpus.front()) << ranks << " ranks on " << all;
    EXPECT_EQ(on.back(), cpus.back()) << ranks << " ranks on " << all;
    for (int k = 1; k < ranks; ++k)
      EXPECT_TRUE(at[size_t(k)] < n && (at[size_t(k)] == at[size_t(k) - 1] || at[size_t(k)] == at[size_t(k) - 1] + 1))
          << "rank " << k << " of " << ranks << " on CPU " << on[size_t(k)] << " after rank " << k - 1 << " on "
          << on[size_t(k) - 1];
    for (int cpu : cpus) {
      const auto here = std::count(on.begin(), on.end(), cpu);
      EXPECT_TRUE(here == ranks / n || here == ranks / n + 1) << here << " of " << ranks << " ranks on CPU " << cpu;
    }
  }
  EXPECT_EQ(shm::place_in_blocks(2, 2), -1) << "a rank past the last placed";
  cpu_set_t mine, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  CPU_ZERO(&one);
  CPU_SET(cpus[0], &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(shm::place_in_blocks(1, 2), -1) << "bound to one CPU, and moved";
  EXPECT_EQ(shm::usable_cpu_list(), std::to_string(cpus[0]));
  ASSERT_EQ(sched_setaffinity(0, sizeof(mine), &mine), 0);
  const char* was = std::getenv("CHORUS_BIND_TO");
  const std::string before = was ? was : "";
  setenv("CHORUS_BIND_TO", "none", 1);
  EXPECT_EQ(shm::place_in_blocks(1, 2), -1) << "moved under CHORUS_BIND_TO=none";
  if (was)
    setenv("CHORUS_BIND_TO", before.c_str(), 1);
  else
    unsetenv("CHORUS_BIND_TO");
  const int crowd = int(cpus.size()) + 1;
  expect_all_ok(run_group(crowd, [&](Communicator& world) {
    RANK_CHECK(shm::usable_cpu_list() == all, "rank ", world.rank(), " of ", crowd, " may run on ",
               shm::usable_cpu_list(), " after its group was made, not ", all);
    world.barrier();
  }));
}

}  // namespace
}  // namespace chorus::test
