// End-to-end: real launchers (chorusrun, Fabric-less torchrun, mpirun, a synthetic SLURM job)
// starting launch_probe. Checks exit codes, what is printed, that failing workers are named, and
// that no worker process or shared-memory segment outlives a run.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "chorus/core/store.h"
#include "chorus/core/tcp_store.h"

#ifndef CHORUSRUN
#error "CHORUSRUN and LAUNCH_PROBE must name the binaries"
#endif

namespace {

using namespace std::chrono_literals;

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
  EXPECT_EQ(count(g.err, "rank 1 ("), 2u) << g.err;
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
