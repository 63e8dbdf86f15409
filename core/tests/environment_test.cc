#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "chorus/core/environment.h"
#include "chorus/core/error.h"
#include "chorus/core/settings.h"
#include "chorus/core/supervisor.h"
#include "net/cost_model.h"

namespace chorus {
namespace {

// Where the environment puts this process: the fields every launcher sets.
struct Place {
  Launcher launcher;
  int rank, world_size, local_rank, local_world_size, node_rank, num_nodes;
};
void expect_place(const Environment& e, const Place& want) {
  EXPECT_EQ(e.launcher, want.launcher);
  EXPECT_EQ(e.rank, want.rank);
  EXPECT_EQ(e.world_size, want.world_size);
  EXPECT_EQ(e.local_rank, want.local_rank);
  EXPECT_EQ(e.local_world_size, want.local_world_size);
  EXPECT_EQ(e.node_rank, want.node_rank);
  EXPECT_EQ(e.num_nodes, want.num_nodes);
}

TEST(Environment, SingleProcessByDefault) {
  auto e = Environment::detect(EnvMap{{"HOME", "/root"}});
  EXPECT_EQ(e.launcher, Launcher::Single);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(Environment, TorchrunStyle) {
  auto e = Environment::detect(EnvMap{{"RANK", "5"},
                                      {"WORLD_SIZE", "8"},
                                      {"LOCAL_RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "4"},
                                      {"GROUP_RANK", "1"},
                                      {"MASTER_ADDR", "10.0.0.1"},
                                      {"MASTER_PORT", "29500"},
                                      {"TORCHELASTIC_RUN_ID", "abc"},
                                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  expect_place(e, {Launcher::Torchrun, 5, 8, 1, 4, 1, 2});
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(e.master_port_taken_by_torchrun);
}

TEST(Environment, PlainEnvNeedsAPort) {
  EXPECT_THROW(Environment::detect(EnvMap{{"RANK", "0"}, {"WORLD_SIZE", "2"}}), InvalidArgument);
  EXPECT_THROW(Environment::detect(EnvMap{{"RANK", "0"}}), InvalidArgument);
  EXPECT_THROW(Environment::detect(EnvMap{{"WORLD_SIZE", "2"}}), InvalidArgument);
  auto e = Environment::detect(EnvMap{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, Launcher::Env);
  EXPECT_FALSE(e.store_hosted);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
}

TEST(Environment, Chorusrun) {
  auto e = Environment::detect(EnvMap{{"RANK", "0"},
                                      {"WORLD_SIZE", "2"},
                                      {"CHORUS_LAUNCHER", "chorusrun"},
                                      {"CHORUS_STORE_ADDR", "127.0.0.1"},
                                      {"CHORUS_STORE_PORT", "4000"}});
  EXPECT_EQ(e.launcher, Launcher::Chorusrun);
  EXPECT_TRUE(e.store_hosted);
  EXPECT_EQ(e.master_port, 4000);
}

// What a chorus launcher gives a worker is what the worker reads back.
TEST(Environment, LauncherVariablesRoundTrip) {
  Environment place;
  place.launcher = Launcher::Chorusrun;
  place.rank = 5;
  place.local_rank = 1;
  place.world_size = 8;
  place.local_world_size = 4;
  place.node_rank = 1;
  place.num_nodes = 2;
  place.master_addr = "10.0.0.7";
  place.master_port = 29511;
  place.store_hosted = true;
  place.restart_count = 2;
  place.job_id = "run-7";
  EnvMap env;
  for (const auto& [k, v] : launcher_environment(place, 3)) env[k] = v;
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  Environment e = Environment::detect(env);
  expect_place(e, {Launcher::Chorusrun, 5, 8, 1, 4, 1, 2});
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 29511);
  EXPECT_TRUE(e.store_hosted);
  EXPECT_FALSE(e.master_port_taken_by_torchrun);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(e.job_id, "run-7");
  Environment one = Environment::detect([] {
    EnvMap m;
    for (const auto& [k, v] : launcher_environment(single_node(2, 3, 4000, "j"))) m[k] = v;
    return m;
  }());
  EXPECT_EQ(one.rank, 2);
  EXPECT_EQ(one.local_world_size, 3);
  EXPECT_EQ(one.master_port, 4000);
  EXPECT_TRUE(one.store_hosted);
}

// Note [Threads of ranks that share the cores]: the launcher fills in what the user left unset.
TEST(Environment, WorkersThreadsAreSetWhereTheUserDidNot) {
  const char* names[] = {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    unsetenv(n);
  }
  auto set_for = [](int nproc) {
    EnvMap m;
    for (const auto& [k, v] : worker_thread_environment(nproc)) m[k] = v;
    return m;
  };
  EXPECT_TRUE(set_for(1).empty());  // one process per machine has the cores to itself
  EXPECT_EQ(set_for(4), (EnvMap{{"OMP_NUM_THREADS", "1"}, {"OMP_WAIT_POLICY", "PASSIVE"}}));
  setenv("OMP_NUM_THREADS", "2", 1);
  EXPECT_EQ(set_for(4), (EnvMap{{"OMP_WAIT_POLICY", "PASSIVE"}}));
  for (const char* n : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"}) {
    setenv(n, "1", 1);
    EXPECT_TRUE(set_for(4).empty()) << n;
    unsetenv(n);
  }
  for (const auto& [n, v] : saved)
    if (v)
      setenv(n.c_str(), v->c_str(), 1);
    else
      unsetenv(n.c_str());
}

// Note [A core for every rank]: each of nproc workers gets an equal share of the launcher's CPUs,
// none shared, unless they outnumber the CPUs, there is one, or CHORUS_BIND_TO=none.
TEST(Environment, WorkersGetCpusOfTheirOwnWhenThereAreEnough) {
  const char* saved = std::getenv("CHORUS_BIND_TO");
  const std::string was = saved ? saved : "";
  unsetenv("CHORUS_BIND_TO");
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> mine;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) mine.push_back(c);
  const int n = int(mine.size());
  EXPECT_TRUE(worker_cpus(0, 1).empty());      // one worker has every CPU
  EXPECT_TRUE(worker_cpus(0, n + 1).empty());  // more workers than CPUs: the scheduler places them
  if (n >= 2) {
    for (int nproc = 2; nproc <= n; ++nproc) {
      std::vector<int> taken;
      for (int local = 0; local < nproc; ++local) {
        const auto cpus = worker_cpus(local, nproc);
        EXPECT_EQ(int(cpus.size()), n / nproc) << local << " of " << nproc;
        taken.insert(taken.end(), cpus.begin(), cpus.end());
      }
      std::vector<int> distinct = taken;
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      EXPECT_EQ(distinct.size(), taken.size()) << "shared CPUs among " << nproc << " workers";
      for (int c : taken) EXPECT_TRUE(CPU_ISSET(c, &set)) << c;
    }
    EXPECT_NE(describe_binding(2, "off").find("binding each of the 2 workers"), std::string::npos);
    setenv("CHORUS_BIND_TO", "none", 1);
    EXPECT_TRUE(worker_cpus(0, 2).empty());
    EXPECT_EQ(describe_binding(2, "off"), "");
  }
  setenv("CHORUS_BIND_TO", "socket", 1);
  try {
    worker_cpus(0, 2);
    ADD_FAILURE() << "CHORUS_BIND_TO=socket was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CHORUS_BIND_TO=socket"), std::string::npos) << e.what();
  }
  if (saved)
    setenv("CHORUS_BIND_TO", was.c_str(), 1);
  else
    unsetenv("CHORUS_BIND_TO");
}

TEST(Environment, BadValuesAreNamed) {
  try {
    Environment::detect(EnvMap{{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
  }
  EXPECT_THROW(Environment::detect(EnvMap{{"RANK", "4"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}), InvalidArgument);
}

TEST(Environment, OpenMpi) {
  auto e = Environment::detect(EnvMap{{"OMPI_COMM_WORLD_RANK", "3"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  expect_place(e, {Launcher::OpenMpi, 3, 4, 1, 2, 1, 2});
  EXPECT_GT(e.master_port, 0);
}

TEST(Environment, Pmi) {
  auto e = Environment::detect(EnvMap{{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_PORT", "777"}});
  expect_place(e, {Launcher::Pmi, 2, 3, 2, 3, 0, 1});  // no local variables: one host
  EXPECT_EQ(e.master_port, 777);
}

TEST(Environment, SlurmWithNodeListAndJobPort) {
  auto e = Environment::detect(EnvMap{{"SLURM_PROCID", "6"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_LOCALID", "2"},
                                      {"SLURM_NODEID", "1"},
                                      {"SLURM_NNODES", "2"},
                                      {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                      {"SLURM_NODELIST", "node[01-03,07],gpu5"},
                                      {"SLURM_JOB_ID", "123456"}});
  expect_place(e, {Launcher::Slurm, 6, 8, 2, 4, 1, 2});
  EXPECT_EQ(e.master_addr, "node01");
  EXPECT_EQ(e.master_port, 15000 + 3456);
  auto m = Environment::detect(EnvMap{{"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "1"},
                                      {"SLURM_NODELIST", "a1"},
                                      {"MASTER_PORT", "999"},
                                      {"MASTER_ADDR", "head"}});
  EXPECT_EQ(m.master_port, 999);
  EXPECT_EQ(m.master_addr, "head");
}

TEST(SlurmNodeList, Expands) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu5"),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(expand_slurm_nodelist("x[9-11]"), (std::vector<std::string>{"x9", "x10", "x11"}));
  EXPECT_THROW(expand_slurm_nodelist("node[01-03"), InvalidArgument);
  EXPECT_THROW(expand_slurm_nodelist("node[05-03]"), InvalidArgument);
}

TEST(Settings, ParsesAndRejects) {
  auto s = read_settings(EnvMap{{"CHORUS_TIMEOUT_MS", "1500"},
                                {"CHORUS_SHM_CHUNK_BYTES", "4096"},
                                {"CHORUS_STORE_TIMEOUT_MS", "2500"},
                                {"CHORUS_BACKEND", "shm"}});
  EXPECT_EQ(s.timeout->count(), 1500);
  EXPECT_EQ(s.store_timeout.count(), 2500);
  EXPECT_EQ(s.backend, "shm");
  EXPECT_EQ(s.shm.chunk_bytes, 4096u);
  EXPECT_THROW(read_settings(EnvMap{{"CHORUS_TIMEOUT_MS", "soon"}}), InvalidArgument);
  EXPECT_THROW(read_settings(EnvMap{{"CHORUS_SHM_CHUNK_BYTES", "8"}}), InvalidArgument);
  EXPECT_EQ(read_settings(EnvMap{}).shm.single_copy, std::nullopt);  // where it pays
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_SINGLE_COPY", "0"}}).shm.single_copy, false);
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_SINGLE_COPY", "1"}}).shm.single_copy, true);
  EXPECT_THROW(read_settings(EnvMap{{"CHORUS_SHM_SINGLE_COPY", "2"}}), InvalidArgument);
  EXPECT_EQ(read_settings(EnvMap{}).shm.stream_slots, std::nullopt);  // measured
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_STREAM_SLOTS", "0"}}).shm.stream_slots, false);
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_STREAM_SLOTS", "1"}}).shm.stream_slots, true);
  EXPECT_THROW(read_settings(EnvMap{{"CHORUS_SHM_STREAM_SLOTS", "yes"}}), InvalidArgument);
  EXPECT_EQ(read_settings(EnvMap{}).shm.stage_bytes, size_t(64) << 20);
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_STAGE_BYTES", "0"}}).shm.stage_bytes, 0u);  // none
  EXPECT_EQ(read_settings(EnvMap{{"CHORUS_SHM_STAGE_BYTES", "1048576"}}).shm.stage_bytes, 1048576u);
  EXPECT_THROW(read_settings(EnvMap{{"CHORUS_SHM_STAGE_BYTES", "-1"}}), InvalidArgument);
}

// What the errors of CHORUS_CROSS_ALGORITHM and CHORUS_CROSS_COST say.
std::string rejection(const EnvMap& env) {
  try {
    read_settings(env);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Settings, AlgorithmsAndCostBetweenHosts) {
  const auto s = read_settings(
      EnvMap{{"CHORUS_CROSS_ALGORITHM", "ring,broadcast=chain"}, {"CHORUS_CROSS_COST", "alpha_us=30,gbps=100"}});
  EXPECT_EQ(s.cross.algorithm, "ring,broadcast=chain");
  const auto forced = net::parse_forced(s.cross.algorithm, "x");
  EXPECT_EQ(forced.at("*"), "ring");
  EXPECT_EQ(forced.at("broadcast"), "chain");
  const auto cost = net::parse_cost(s.cross.cost);
  EXPECT_DOUBLE_EQ(cost.alpha, 30e-6);
  EXPECT_DOUBLE_EQ(cost.beta, 8.0 / 100e9);
  EXPECT_EQ(net::choose(OpKind::Broadcast, 1 << 20, 8, cost, forced), net::Algorithm::Chain);
  EXPECT_EQ(net::choose(OpKind::AllReduce, 8, 8, cost, forced), net::Algorithm::Ring);
  // Unforced, the model: recursive doubling for 8 bytes, halving-doubling for 64 MiB on 8 ranks.
  EXPECT_EQ(net::choose(OpKind::AllReduce, 8, 8, cost, {}), net::Algorithm::RecursiveDoubling);
  EXPECT_EQ(net::choose(OpKind::AllReduce, 64 << 20, 8, cost, {}), net::Algorithm::HalvingDoubling);
  EXPECT_NE(rejection({{"CHORUS_CROSS_ALGORITHM", "rings"}}).find("unknown algorithm 'rings'"), std::string::npos);
  EXPECT_NE(rejection({{"CHORUS_CROSS_ALGORITHM", "broadcast=ring"}}).find("broadcast cannot run 'ring'"),
            std::string::npos);
  EXPECT_NE(rejection({{"CHORUS_CROSS_ALGORITHM", "gather=ring"}}).find("'gather' has no choice"), std::string::npos);
  EXPECT_NE(rejection({{"CHORUS_CROSS_COST", "alpha_us=fast"}}).find("'alpha_us=fast'"), std::string::npos);
  EXPECT_NE(rejection({{"CHORUS_CROSS_COST", "latency=3"}}).find("unknown term 'latency'"), std::string::npos);
  EXPECT_NE(rejection({{"CHORUS_CROSS_COST", "gbps=-1"}}).find("CHORUS_CROSS_COST"), std::string::npos);
}

// A chain broadcast's segments stream down it: each hop's latency is paid once, not per segment.
// The terms tcp measured on 4 namespace hosts of one rank (alpha 32 us, 15.74 Gb/s), where forcing
// each algorithm at 1 MiB took: chain 0.3-0.6 ms, scatter_ring 1.0 ms, binomial 1.1 ms. Charging
// alpha per segment made scatter_ring look faster.
TEST(CostModel, AChainPaysEachHopsLatencyOnce) {
  const auto cost = net::parse_cost("alpha_us=32,gbps=15.74,o_us=2");
  EXPECT_EQ(net::choose(OpKind::Broadcast, 1 << 20, 4, cost, {}), net::Algorithm::Chain);
  const size_t s = net::chain_segments(1 << 20, 4, cost);
  EXPECT_GT(s, 1u);
  const double step = 2 * cost.o + double(1 << 20) / double(s) * cost.beta;
  EXPECT_DOUBLE_EQ(net::predict(OpKind::Broadcast, net::Algorithm::Chain, 1 << 20, 4, cost),
                   3 * cost.alpha + double(2 + s) * step);
  // Small messages still go by the binomial tree (log2 P rounds against P - 1 hops); two ranks
  // have nothing to pipeline.
  EXPECT_EQ(net::choose(OpKind::Broadcast, 8, 4, cost, {}), net::Algorithm::Binomial);
  EXPECT_EQ(net::chain_segments(64 << 20, 2, cost), 1u);
}

}  // namespace
}  // namespace chorus
