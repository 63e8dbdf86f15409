// End-to-end: real launchers (chorusrun, Fabric-less torchrun, mpirun, a synthetic SLURM job)
// starting launch_probe. Checks exit codes, what is printed, that failing workers are named, and
// that no worker process or shared-memory segment outlives a run.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "chorus/core/communicator.h"
#include "chorus/core/elastic.h"
#include "chorus/core/elastic_agent.h"
#include "chorus/core/error.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/store.h"
#include "chorus/core/tcp_store.h"

#ifndef CHORUSRUN
#error "CHORUSRUN and LAUNCH_PROBE must name the binaries"
#endif

namespace {

using namespace std::chrono_literals;
using chorus::detail::concat;

struct Run {
  int exit_code = -1;  // 128 + signal when killed
  std::string out, err;
  pid_t pid = 0;
};

// Starts argv (env added), returns at once with the pid; finish() collects the output.
struct Process {
  pid_t pid = 0;
  int out = -1, err = -1;
  std::string out_text, err_text;

  Process(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env = {}) {
    int o[2], e[2];
    if (pipe(o) != 0 || pipe(e) != 0) throw std::runtime_error("pipe");
    pid = fork();
    if (pid == 0) {
      dup2(o[1], 1);
      dup2(e[1], 2);
      close(o[0]);
      close(e[0]);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::perror("exec");
      _exit(127);
    }
    close(o[1]);
    close(e[1]);
    out = o[0];
    err = e[0];
  }

  Run finish(std::chrono::seconds limit = 120s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (out >= 0 || err >= 0) {
      pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
      if (poll(fds, 2, 100) < 0) break;
      for (int i = 0; i < 2; ++i) {
        int& fd = i == 0 ? out : err;
        if (fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[65536];
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
          close(fd);
          fd = -1;
        } else {
          (i == 0 ? out_text : err_text).append(buf, size_t(n));
        }
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        ADD_FAILURE() << "the command ran past " << limit.count() << " s";
        break;
      }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    Run r;
    r.pid = pid;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = out_text;
    r.err = err_text;
    return r;
  }
};

Run run(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  return Process(argv, env).finish();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string temp_dir() {
  char tmpl[] = "/tmp/chorusrun-test-XXXXXX";
  return mkdtemp(tmpl);
}

std::vector<int> pids_in(const std::string& dir) {
  std::vector<int> pids;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".pid") {
        std::ifstream f(dir + "/" + n);
        int pid = 0;
        f >> pid;
        if (pid) pids.push_back(pid);
      }
    }
    closedir(d);
  }
  return pids;
}

bool alive(int pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string a, b, state;
  f >> a >> b >> state;
  return state != "Z" && state != "X";
}

// Every pid gone (not even a zombie left to us) within `limit`.
bool all_gone(const std::vector<int>& pids, std::chrono::milliseconds limit = 3000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool any = false;
    for (int p : pids) any = any || alive(p);
    if (!any) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

std::vector<std::string> segments_of(const std::vector<int>& pids) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      for (int p : pids)
        if (std::string(e->d_name).rfind("chorus-" + std::to_string(p) + "-", 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// A port for a launcher to bind later. Not from the ephemeral range (32768-60999 here), where the
// outgoing connections of tests running in parallel could take it in the meantime.
int free_port() {
  static unsigned seed = unsigned(getpid()) * 2654435761u;
  for (;;) {
    seed = seed * 1103515245u + 12345u;
    const int port = 20000 + int((seed >> 8) % 12000);
    try {
      chorus::TcpStoreServer probe("127.0.0.1", port);
      return port;
    } catch (const std::exception&) {
    }
  }
}

void expect_probes(const std::string& out, int world, const std::string& launcher, bool prefixed = true) {
  for (int r = 0; r < world; ++r) {
    const std::string line = std::string(prefixed ? "[rank " + std::to_string(r) + "] " : "") +
                             "probe rank=" + std::to_string(r) + " world=" + std::to_string(world);
    EXPECT_EQ(count(out, line), 1u) << "missing: " << line << "\n" << out;
  }
  EXPECT_EQ(count(out, "launcher=" + launcher), size_t(world)) << out;
  EXPECT_EQ(count(out, "sum=ok"), size_t(world)) << out;
}

TEST(Chorusrun, FourRanksSucceed) {
  auto r = run({CHORUSRUN, "--nproc-per-node", "4", "--master-port", "0", LAUNCH_PROBE});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_probes(r.out, 4, "chorusrun");
  EXPECT_NE(r.out.find("local=3/4"), std::string::npos) << r.out;
  auto a = run({CHORUSRUN, "--nproc-per-node", "auto", "--master-port", "0", LAUNCH_PROBE});  // one per core
  EXPECT_EQ(a.exit_code, 0) << a.err;
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cores = CPU_COUNT(&set);
  expect_probes(a.out, cores, "chorusrun");
}

// Note [Threads of ranks that share the cores]: the workers' OpenMP threads sleep when idle unless
// the user chose otherwise, and chorusrun says what it set.
TEST(Chorusrun, WorkersThreadsSleepWhenIdleUnlessTheUserChose) {
  auto r = run({"/usr/bin/env", "-u", "OMP_WAIT_POLICY", "-u", "GOMP_SPINCOUNT", "-u", "KMP_BLOCKTIME", CHORUSRUN,
                "--nproc-per-node", "2", "--master-port", "0", "/usr/bin/env"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"[rank 0] OMP_WAIT_POLICY=PASSIVE", "[rank 1] OMP_WAIT_POLICY=PASSIVE"})
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("OMP_WAIT_POLICY=PASSIVE for each of the 2 workers"), std::string::npos) << r.err;
  auto chosen = run({"/usr/bin/env", "OMP_WAIT_POLICY=ACTIVE", CHORUSRUN, "--nproc-per-node", "2", "--master-port", "0",
                     "/usr/bin/env"});
  EXPECT_EQ(chosen.exit_code, 0) << chosen.err;
  EXPECT_NE(chosen.out.find("[rank 1] OMP_WAIT_POLICY=ACTIVE"), std::string::npos) << chosen.out;
  EXPECT_EQ(chosen.out.find("PASSIVE"), std::string::npos) << chosen.out;
  EXPECT_EQ(chosen.err.find("OMP_WAIT_POLICY"), std::string::npos) << chosen.err;
}

// Note [A core for every rank]: workers that do not outnumber the CPUs run on CPUs of their own,
// and chorusrun says so; --bind-to none (or CHORUS_BIND_TO=none) leaves them where the scheduler
// puts them, and a value chorusrun does not know is an error that names it.
TEST(Chorusrun, WorkersRunOnCpusOfTheirOwnUnlessTold) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  if (CPU_COUNT(&set) < 2) GTEST_SKIP() << "one CPU";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  const std::vector<std::string> show = {"/usr/bin/grep", "Cpus_allowed_list", "/proc/self/status"};
  auto chorusrun = [&](std::vector<std::string> flags) {
    std::vector<std::string> args = {"/usr/bin/env",     "-u", "CHORUS_BIND_TO", CHORUSRUN,
                                     "--nproc-per-node", "2",  "--master-port",  "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), show.begin(), show.end());
    return run(args);
  };
  auto bound = chorusrun({});
  ASSERT_EQ(bound.exit_code, 0) << bound.err;
  const size_t share = cpus.size() / 2;
  for (int local = 0; local < 2; ++local) {
    const int first = cpus[size_t(local) * share], last = cpus[size_t(local) * share + share - 1];
    const std::string list = first == last ? std::to_string(first) : concat(first, "-", last);
    if (last - first + 1 == int(share)) {  // consecutive CPUs print as one range
      EXPECT_NE(bound.out.find(concat("[rank ", local, "] Cpus_allowed_list:\t", list, "\n")), std::string::npos)
          << bound.out;
    }
  }
  EXPECT_NE(bound.err.find("binding each of the 2 workers to"), std::string::npos) << bound.err;
  auto free = chorusrun({"--bind-to", "none"});
  ASSERT_EQ(free.exit_code, 0) << free.err;
  std::ifstream status("/proc/self/status");
  std::string line, mine;
  while (std::getline(status, line))
    if (line.rfind("Cpus_allowed_list", 0) == 0) mine = line;
  EXPECT_NE(free.out.find("[rank 1] " + mine), std::string::npos) << free.out << " against " << mine;
  EXPECT_EQ(free.err.find("binding"), std::string::npos) << free.err;
  auto bad = run(
      {"/usr/bin/env", "CHORUS_BIND_TO=socket", CHORUSRUN, "--nproc-per-node", "2", "--master-port", "0", "/bin/true"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("CHORUS_BIND_TO=socket: expected cores"), std::string::npos) << bad.err;
  auto bad_flag = run({CHORUSRUN, "--bind-to", "socket", "--nproc-per-node", "2", "/bin/true"});
  EXPECT_NE(bad_flag.exit_code, 0);
  EXPECT_NE(bad_flag.err.find("--bind-to"), std::string::npos) << bad_flag.err;
}

TEST(Chorusrun, HelpReadsLikeTorchrun) {
  auto r = run({CHORUSRUN, "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--max-restarts", "--log-dir", "--no-prefix"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  auto bad = run({CHORUSRUN, "--nproc-per-node", "2"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("no program"), std::string::npos) << bad.err;
  auto missing = run({CHORUSRUN, "--master-port", "0", "/no/such/program"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("cannot start rank 0: '/no/such/program'"), std::string::npos) << missing.err;
}

TEST(Chorusrun, CrashBySignalIsNamedAndTheGroupStopped) {
  const std::string dir = temp_dir();
  auto r = run({CHORUSRUN, "--nproc-per-node", "3", "--master-port", "0", LAUNCH_PROBE, "--signal-rank", "2", "--sleep",
                "60", "--pid-dir", dir});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 2 \(pid \d+\) was killed by SIGSEGV)"))) << r.err;
  const auto pids = pids_in(dir);
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_TRUE(all_gone(pids));
  EXPECT_TRUE(segments_of(pids).empty());
}

TEST(Chorusrun, NonZeroExitIsNamed) {
  const std::string dir = temp_dir();
  auto r = run({CHORUSRUN, "--nproc-per-node", "4", "--master-port", "0", LAUNCH_PROBE, "--exit-rank", "3", "--code",
                "7", "--sleep", "60", "--pid-dir", dir});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 3 \(pid \d+\) exited with code 7)"))) << r.err;
  const auto pids = pids_in(dir);
  EXPECT_TRUE(all_gone(pids));
  EXPECT_TRUE(segments_of(pids).empty());
}

// chorusrun killed by a signal: no worker survives it.
void kill_launcher(int signal, int want_exit) {
  const std::string dir = temp_dir();
  Process p({CHORUSRUN, "--nproc-per-node", "3", "--master-port", "0", "--stop-timeout", "2", LAUNCH_PROBE, "--sleep",
             "120", "--pid-dir", dir});
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (pids_in(dir).size() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(300ms);  // let them meet
  const auto pids = pids_in(dir);
  ASSERT_EQ(pids.size(), 3u);
  kill(p.pid, signal);
  auto r = p.finish();
  EXPECT_EQ(r.exit_code, want_exit) << r.err;
  EXPECT_TRUE(all_gone(pids)) << "a worker outlived chorusrun (signal " << signal << ")";
  EXPECT_TRUE(segments_of(pids).empty());  // unlinked once every rank attached
  if (signal != SIGKILL) {
    EXPECT_NE(r.err.find("stopped the workers"), std::string::npos) << r.err;
  }
}

TEST(Chorusrun, KilledBySigkillLeavesNoWorker) { kill_launcher(SIGKILL, 128 + SIGKILL); }
TEST(Chorusrun, SigtermStopsTheWorkers) { kill_launcher(SIGTERM, 128 + SIGTERM); }
TEST(Chorusrun, SigintStopsTheWorkers) { kill_launcher(SIGINT, 128 + SIGINT); }

TEST(Chorusrun, RestartsHappenAndStopAtTheLimit) {
  auto r = run({CHORUSRUN, "--nproc-per-node", "3", "--master-port", "0", "--max-restarts", "2", LAUNCH_PROBE,
                "--fail-until-restart", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("restart 1 of 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restart 2 of 2"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.out, "restart=2 sum=ok"), 3u) << r.out;  // the last attempt meets under its own keys

  auto g = run({CHORUSRUN, "--nproc-per-node", "2", "--master-port", "0", "--max-restarts", "1", LAUNCH_PROBE,
                "--fail-until-restart", "5"});
  EXPECT_EQ(g.exit_code, 1);
  EXPECT_NE(g.err.find("giving up after 1 restart(s)"), std::string::npos) << g.err;
  EXPECT_EQ(count(g.err, "rank 1 (pid "), 2u) << g.err;
}

TEST(Chorusrun, OutputLinesAreWholeAndPrefixedAndLogged) {
  const std::string dir = temp_dir();
  const int kLines = 3000;
  auto r = run({CHORUSRUN, "--nproc-per-node", "3", "--master-port", "0", "--log-dir", dir, LAUNCH_PROBE, "--lines",
                std::to_string(kLines)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex line(R"(\[rank (\d)\] line rank=(\d) i=(\d+) ([a-z])+)");
  std::vector<int> next(3, 0);
  for (const auto& l : lines_of(r.out)) {
    if (l.find(" line rank=") == std::string::npos) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << "torn or unprefixed line: " << l;
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(std::stoi(m[3]), next[size_t(rank)]++);  // each rank's lines in order
    EXPECT_EQ(l.size(), l.find(" i=") + 3 + m[3].length() + 1 + 120) << l;
  }
  for (int n : next) EXPECT_EQ(n, kLines);
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream log(dir + "/rank_" + std::to_string(rank) + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_EQ(count(text, "line rank=" + std::to_string(rank) + " "), size_t(kLines));
    EXPECT_EQ(count(text, "[rank"), 0u);
  }
  auto plain = run({CHORUSRUN, "--nproc-per-node", "2", "--master-port", "0", "--no-prefix", LAUNCH_PROBE});
  EXPECT_EQ(plain.exit_code, 0);
  expect_probes(plain.out, 2, "chorusrun", false);
}

TEST(Chorusrun, TwoNodesMeetThroughNodeZerosStore) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Process>> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(std::make_unique<Process>(
        std::vector<std::string>{CHORUSRUN, "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node",
                                 "2", "--master-addr", "127.0.0.1", "--master-port", port, LAUNCH_PROBE}));
  std::string out;
  for (auto& n : nodes) {
    auto r = n->finish();
    EXPECT_EQ(r.exit_code, 0) << r.err;
    out += r.out;
  }
  expect_probes(out, 4, "chorusrun");
  EXPECT_EQ(count(out, "local=1/2 node=1"), 1u) << out;
  auto bad = run({CHORUSRUN, "--nnodes", "2", "--master-port", "0", LAUNCH_PROBE});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("one node only"), std::string::npos) << bad.err;
}

TEST(Launchers, Torchrun) {
  if (std::string(CHORUS_PYTHON).empty()) GTEST_SKIP() << "no Python with torch was found at configure time";
  // torchrun is torch.distributed.run of the Python that has torch.
  for (bool standalone : {true, false}) {
    const std::string dir = temp_dir();
    std::vector<std::string> argv = {CHORUS_PYTHON,
                                     "-m",
                                     "torch.distributed.run",
                                     "--nproc_per_node",
                                     "3",
                                     "--redirects",
                                     "1",
                                     "--tee",
                                     "2",
                                     "--log_dir",
                                     dir,
                                     "--no_python"};
    if (standalone)
      argv.insert(argv.begin() + 3, "--standalone");
    else
      argv.insert(argv.begin() + 3, {"--master_port", std::to_string(free_port())});  // the agent's store
    argv.push_back(LAUNCH_PROBE);
    auto r = run(argv, {{"CHORUS_STORE_TIMEOUT_MS", "60000"}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto f = run({"sh", "-c", "cat $(find " + dir + " -name stdout.log | sort)"});
    expect_probes(f.out, 3, "torchrun", false);
  }
}

TEST(Launchers, Mpirun) {
  if (access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::vector<std::string> base = {"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3"};
  auto with_port = base;
  with_port.insert(with_port.end(), {"-x", "MASTER_PORT=" + std::to_string(free_port()), LAUNCH_PROBE});
  auto r = run(with_port);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_probes(r.out, 3, "Open MPI", false);
  auto from_job = base;  // no MASTER_PORT: the port comes from the job id
  from_job.push_back(LAUNCH_PROBE);
  auto j = run(from_job);
  EXPECT_EQ(j.exit_code, 0) << j.err;
  expect_probes(j.out, 3, "Open MPI", false);
}

TEST(Launchers, SyntheticSlurmJob) {
  std::vector<std::unique_ptr<Process>> ranks;
  const std::string job = std::to_string(100000 + getpid() % 50000);
  for (int r = 0; r < 3; ++r)
    ranks.push_back(
        std::make_unique<Process>(std::vector<std::string>{LAUNCH_PROBE},
                                  std::vector<std::pair<std::string, std::string>>{{"SLURM_PROCID", std::to_string(r)},
                                                                                   {"SLURM_LOCALID", std::to_string(r)},
                                                                                   {"SLURM_NODEID", "0"},
                                                                                   {"SLURM_NTASKS", "3"},
                                                                                   {"SLURM_NNODES", "1"},
                                                                                   {"SLURM_TASKS_PER_NODE", "3"},
                                                                                   {"SLURM_JOB_ID", job},
                                                                                   {"SLURM_NODELIST", "localhost"},
                                                                                   {"MASTER_ADDR", "127.0.0.1"}}));
  std::string out;
  for (auto& p : ranks) {
    auto r = p->finish();
    EXPECT_EQ(r.exit_code, 0) << r.err;
    out += r.out;
  }
  expect_probes(out, 3, "SLURM", false);
}

}  // namespace

// --- Elastic: several agents on this host, each a "node" (the namespace tests,
// tests/elastic_hosts.sh, cover separate hosts, dead ones and cut links).

std::vector<std::string> elastic(const std::string& nnodes, int port, const std::string& run_id,
                                 std::vector<std::string> program, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {CHORUSRUN,
                                   "--nnodes",
                                   nnodes,
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port),
                                   "--rdzv-id",
                                   run_id,
                                   "--rdzv-conf",
                                   "join_timeout=6,last_call_timeout=0.5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

TEST(Elastic, BadNodeCountsAreRefusedBeforeAnythingStarts) {
  for (const auto& [nnodes, says] : std::vector<std::pair<std::string, std::string>>{
           {"3:2", "MIN must not exceed MAX"}, {"0:2", "at least 1"}, {"2:x", "is not N or MIN:MAX"}}) {
    auto r = run(elastic(nnodes, free_port(), "bad", {"true"}));
    EXPECT_EQ(r.exit_code, 2) << nnodes;
    EXPECT_NE(r.err.find(says), std::string::npos) << nnodes << ": " << r.err;
  }
  auto s = run({CHORUSRUN, "--standalone", "--nnodes", "1:2", "true"});
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.err.find("cannot be elastic"), std::string::npos) << s.err;
}

TEST(Elastic, ThreeNodesGetDenseRanksAndOneStoreAndOneMasterPort) {
  const int port = free_port();
  const std::vector<std::string> program = {
      "sh", "-c",
      "echo probe rank=$RANK world=$WORLD_SIZE node=$GROUP_RANK/$GROUP_WORLD_SIZE "
      "store=$CHORUS_STORE_ADDR:$CHORUS_STORE_PORT master=$MASTER_ADDR:$MASTER_PORT"};
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i)
    agents.push_back(std::make_unique<Process>(elastic("2:3", port, "dense", program, {"--nproc-per-node", "2"})));
  std::string all;
  std::set<std::string> stores, masters;
  for (auto& a : agents) {
    auto r = a->finish();
    EXPECT_EQ(r.exit_code, 0) << r.err;
    all += r.out;
    for (const auto& line : lines_of(r.out)) {
      std::smatch m;
      if (std::regex_search(line, m, std::regex("store=(\\S+) master=(\\S+)"))) {
        stores.insert(m[1]);
        masters.insert(m[2]);
      }
    }
  }
  for (int r = 0; r < 6; ++r)
    EXPECT_EQ(count(all, "probe rank=" + std::to_string(r) + " world=6 node=" + std::to_string(r / 2) + "/3"), 1u)
        << all;
  EXPECT_EQ(stores.size(), 1u) << all;
  EXPECT_EQ(masters.size(), 1u) << all;
}

TEST(Elastic, AgentsThatDisagreeOnTheJobAreRefusedByName) {
  // Two endpoints' agents with different --nproc-per-node: neither runs anything.
  const int port = free_port(), port2 = free_port();
  const std::string endpoints = "127.0.0.1:" + std::to_string(port) + ",127.0.0.1:" + std::to_string(port2);
  auto with = [&](const std::string& nproc) {
    return std::vector<std::string>{
        CHORUSRUN,        "--nnodes", "2:2", "--nproc-per-node", nproc, "--rdzv-endpoint", endpoints, "--rdzv-conf",
        "join_timeout=5", "echo",     "ran"};
  };
  Process a(with("1")), b(with("2"));
  auto ra = a.finish(), rb = b.finish();
  EXPECT_NE(ra.exit_code, 0);
  EXPECT_NE(rb.exit_code, 0);
  EXPECT_EQ(ra.out.find("ran"), std::string::npos) << ra.out;
  for (const auto* r : {&ra, &rb}) {
    EXPECT_NE(r->err.find("every agent of a job needs the same"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("nproc-per-node 1'"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("nproc-per-node 2'"), std::string::npos) << r->err;
  }

  // A job of run "left" runs alone (MIN 1); an agent of run "right" aimed at it is refused, and a
  // stray client without the job's secret can read nothing from its store; the job is unharmed.
  const int p3 = free_port();
  const std::vector<std::pair<std::string, std::string>> secret = {{"CHORUS_RDZV_SECRET", "s3cret"}};
  Process job(elastic("1:2", p3, "left", {"sh", "-c", "sleep 4; echo done"}), secret);
  std::this_thread::sleep_for(700ms);
  try {
    chorus::TcpStore stray("127.0.0.1", p3, 2000ms, std::string());
    stray.get("state");
    ADD_FAILURE() << "a client without the secret read the rendezvous";
  } catch (const chorus::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("did not prove it knows it"), std::string::npos) << e.what();
  }
  auto wrong = run(elastic("1:2", p3, "left", {"echo", "ran"}), {{"CHORUS_RDZV_SECRET", "guess"}});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_EQ(wrong.out.find("ran"), std::string::npos);
  EXPECT_NE(wrong.err.find("differs from this job's"), std::string::npos) << wrong.err;
  auto other = run(elastic("1:2", p3, "right", {"echo", "ran"}), secret);
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("belongs to another job or configuration ('run left"), std::string::npos) << other.err;
  auto done = job.finish();
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("done"), std::string::npos);
}

TEST(Elastic, LosingANodeFormsARoundOfTheRestAndAFailureDuringRecoveryAnother) {
  // Three single-worker nodes; the agent holding node 2 is killed with its workers. In the next
  // round node 0's worker fails once more (a failure during the recovery): a third round forms,
  // and the job finishes, with 2 of --max-restarts 2 spent. The workers' pids go to `dir`.
  const int port = free_port();
  const std::string dir = temp_dir();
  const std::string script = "echo $$ > " + dir +
                             "/$TORCHELASTIC_RUN_ID-$RANK-$$.pid; echo probe rank=$RANK world=$WORLD_SIZE "
                             "round=$TORCHELASTIC_RESTART_COUNT; "
                             "if [ $WORLD_SIZE = 3 ]; then exec sleep 30; fi; "
                             "if [ $RANK = 0 ] && [ ! -e " +
                             dir + "/failed ]; then touch " + dir + "/failed; exit 3; fi; sleep 1";
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i)
    agents.push_back(
        std::make_unique<Process>(elastic("2:3", port, "lose", {"sh", "-c", script}, {"--max-restarts", "2"})));
  std::this_thread::sleep_for(2500ms);
  // The agent whose worker is rank 2 (by its output) is the victim.
  int victim = -1;
  for (int i = 0; i < 3 && victim < 0; ++i) {
    char buf[4096];
    ssize_t n = read(agents[size_t(i)]->out, buf, sizeof(buf));
    if (n > 0) agents[size_t(i)]->out_text.append(buf, size_t(n));
    if (agents[size_t(i)]->out_text.find("probe rank=2 world=3") != std::string::npos) victim = i;
  }
  ASSERT_GE(victim, 0) << "no node ran rank 2 in the first round";
  const auto before = pids_in(dir);
  kill(agents[size_t(victim)]->pid, SIGKILL);  // its workers die with it (PR_SET_PDEATHSIG)
  std::string all;
  for (int i = 0; i < 3; ++i) {
    auto r = agents[size_t(i)]->finish();
    if (i == victim) continue;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    all += r.out + r.err;
  }
  EXPECT_NE(all.find("is gone (its agent does not answer"), std::string::npos) << all;
  EXPECT_NE(all.find("probe rank=1 world=2"), std::string::npos) << all;
  EXPECT_EQ(count(all, "round 2: 2 node(s)"), 2u) << all;  // after the failure in round 1
  EXPECT_TRUE(all_gone(pids_in(dir))) << "a worker outlived its job";
  EXPECT_TRUE(segments_of(pids_in(dir)).empty());
  (void)before;
}

// A round that ends while a rank still meets in its store: an in-process worker on its way into
// the group of a round another agent's proposal overtook (Note [Elastic in process]). The agent
// that served the round ends its rendezvous as it moves on, and the rank raises PeerFailure
// saying so within seconds, not at its deadline waiting for ranks that went ahead.
TEST(Elastic, RanksStillMeetingInARoundThatEndedStopWaiting) {
  chorus::ElasticOptions o;
  o.run_id = "overtaken";
  o.min_nodes = o.max_nodes = 2;
  o.endpoints = {{"127.0.0.1", free_port()}};
  o.join_timeout = 20s;
  chorus::ElasticAgent a(o), b(o);  // a serves the endpoint: node 0, and the rounds' stores
  auto both = [&] {
    auto other = std::async(std::launch::async, [&] { return b.next_round(chorus::ElasticAgent::Cause::Membership); });
    chorus::Round r = a.next_round(chorus::ElasticAgent::Cause::Membership);
    other.get();
    return r;
  };
  both();
  const chorus::Round round = both();  // round 1: its ranks meet under the keys of attempt 1
  ASSERT_EQ(round.number, 1);
  ASSERT_EQ(round.members[0].id, a.self().id);
  auto store = chorus::attempt_store(std::make_shared<chorus::TcpStore>(round.members[0].addr, round.store_port), 1);
  auto meeting = std::async(std::launch::async, [&] {
    chorus::CommunicatorOptions co;
    co.timeout = 30s;
    try {
      chorus::Communicator::create(store, 0, 2, co);  // its peer never comes
      return std::string("formed");
    } catch (const chorus::PeerFailure& e) {
      return std::string(e.what());
    } catch (const chorus::Error& e) {
      return std::string("not PeerFailure: ") + e.what();
    }
  });
  std::this_thread::sleep_for(500ms);
  const auto ended = std::chrono::steady_clock::now();
  EXPECT_EQ(both().number, 2);
  const std::string said = meeting.get();
  EXPECT_NE(said.find("stopped waiting for the others to join: round 1 is over"), std::string::npos) << said;
  EXPECT_LT(std::chrono::steady_clock::now() - ended, 10s) << said;
}

// In-process workers say so in their own agent's store as well as in the round's (node 0's), so
// an agent whose node 0 is lost before its monitor asked the round's store still keeps its workers
// waiting in their processes instead of stopping them. b's heartbeat is long enough that its
// monitor never asks while node 0 is there.
TEST(Elastic, AnAgentWhoseNodeZeroIsLostStillKnowsItsWorkersRecoverInProcess) {
  chorus::ElasticOptions o;
  o.run_id = "in-process";
  o.min_nodes = 1;
  o.max_nodes = 2;
  o.endpoints = {{"127.0.0.1", free_port()}};
  o.join_timeout = 20s;
  auto a = std::make_unique<chorus::ElasticAgent>(o);  // serves the endpoint: node 0
  chorus::ElasticOptions ob = o;
  ob.heartbeat = 60s;
  chorus::ElasticAgent b(ob);
  auto other = std::async(std::launch::async, [&] { return b.next_round(chorus::ElasticAgent::Cause::Membership); });
  const chorus::Round round = a->next_round(chorus::ElasticAgent::Cause::Membership);
  ASSERT_EQ(other.get().number, round.number);
  ASSERT_EQ(round.members.size(), 2u);
  ASSERT_EQ(round.members[0].id, a->self().id);
  EXPECT_FALSE(b.workers_in_process());
  {  // one of b's workers, as chorusrun starts it
    ::setenv("CHORUS_ELASTIC", "1", 1);
    ::setenv("CHORUS_AGENT_ADDR", b.self().addr.c_str(), 1);
    ::setenv("CHORUS_AGENT_PORT", std::to_string(b.self().port).c_str(), 1);
    ::setenv("CHORUS_STORE_ADDR", round.members[0].addr.c_str(), 1);
    ::setenv("CHORUS_STORE_PORT", std::to_string(round.store_port).c_str(), 1);
    chorus::TcpStoreServer own("127.0.0.1", 0);
    auto comm = chorus::Communicator::create(std::make_shared<chorus::TcpStore>("127.0.0.1", own.port()), 0, 1);
    chorus::elastic::announce_in_process(*comm);
    for (const char* v :
         {"CHORUS_ELASTIC", "CHORUS_AGENT_ADDR", "CHORUS_AGENT_PORT", "CHORUS_STORE_ADDR", "CHORUS_STORE_PORT"})
      ::unsetenv(v);
  }
  a.reset();  // node 0, and the round's store with it, are gone
  EXPECT_TRUE(b.workers_in_process());
}

TEST(Elastic, FewerThanMinLeftWaitsThenNamesTheLostNodes) {
  const int port = free_port();
  // a first: it serves the endpoint and is node 0, so the survivor keeps half of the round (with
  // node 0) and what stops it is MIN.
  Process a(elastic("2:2", port, "few", {"sleep", "30"}, {"--max-restarts", "3"}));
  std::this_thread::sleep_for(300ms);
  Process b(elastic("2:2", port, "few", {"sleep", "30"}, {"--max-restarts", "3"}));
  std::this_thread::sleep_for(2000ms);
  kill(b.pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = a.finish();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.finish();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no round could be formed within 6 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fewer than the minimum of 2; lost since round 0: "), std::string::npos) << r.err;
  EXPECT_GE(waited, 5.0);
  EXPECT_LT(waited, 30.0);
}
