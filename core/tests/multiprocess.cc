#include "multiprocess.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "chorus/core/environment.h"
#include "chorus/core/prefix_store.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/tcp_store.h"

namespace chorus::test {

namespace {

// Runs one rank's body on the context make() gives: nothing when it returned, or what either
// threw.
template <class MakeContext>
std::optional<std::string> run_body(const std::function<void(RankContext&)>& body, MakeContext make) {
  try {
    RankContext ctx = make();
    body(ctx);
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

// Note [Suites under mpirun]: MPI ranks cannot be forked, so `mpirun -np N <test binary>` runs
// the suites on the mpi backend the other way round: every process of the job runs the same
// tests in the same order, and run_ranks runs the body in processes 0..W-1 of the job instead
// of forking W children. The ranks meet on the job's store (rank 0 serves it, as for any
// program under mpirun), under keys of their own for each run, and swap their results there so
// that every process reaches the same verdict; only process 0 prints gtest's report (all do with
// CHORUS_TEST_ALL_RANKS_PRINT=1, for debugging).
struct MpiJob {
  int rank = 0, size = 0, port = 0;
  std::shared_ptr<Store> store;
  std::shared_ptr<Communicator> world;
  uint64_t runs = 0;
};

MpiJob* mpi_job() {
  static const std::unique_ptr<MpiJob> job = []() -> std::unique_ptr<MpiJob> {
    if (!std::getenv("OMPI_COMM_WORLD_RANK")) return nullptr;
    auto j = std::make_unique<MpiJob>();
    const Environment env = Environment::detect();
    j->rank = env.rank;
    j->size = env.world_size;
    j->port = env.master_port;
    j->store = connect_store(env);
    // MPI_Init is collective over the whole job: a world group first, before tests that use
    // only some of the processes.
    CommunicatorOptions o;
    o.backend = "mpi";
    j->world = Communicator::create(std::make_shared<PrefixStore>("job/", j->store), j->rank, j->size, o);
    const bool quiet = j->rank != 0 && !std::getenv("CHORUS_TEST_ALL_RANKS_PRINT");
    if (quiet && !std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("cannot silence stdout");
    return j;
  }();
  return job.get();
}

// Under mpirun a hung body cannot be killed from outside: it ends its process, and mpirun the job.
class HangGuard {
 public:
  HangGuard(std::chrono::seconds limit, int rank) {
    thread_ = std::thread([this, limit, rank] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
        std::fprintf(stderr, "rank %d: the test body ran past %lld s (hang?); ending the job\n", rank,
                     (long long)limit.count());
        std::_Exit(3);
      }
    });
  }
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::vector<RankResult> run_ranks_in_job(MpiJob& job, int world, const std::function<void(RankContext&)>& body,
                                         std::chrono::seconds limit) {
  if (world > job.size)
    throw std::runtime_error(detail::concat("this test needs ", world, " ranks: run it under mpirun -np ", world,
                                            " or more (the job has ", job.size, ")"));
  auto store = std::make_shared<PrefixStore>(detail::concat("run/", ++job.runs, "/"), job.store);
  if (job.rank < world) {
    std::optional<std::string> failure;
    {
      HangGuard guard(limit, job.rank);
      failure = run_body(body, [&] { return RankContext{job.rank, world, store, job.port}; });
    }
    store->set(detail::concat("result/", job.rank),
               detail::concat(failure ? 1 : 0, " ", getpid(), " ", failure.value_or("")));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(detail::concat("result/", r));
  store->wait(keys, limit);
  std::vector<RankResult> results(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::istringstream in(store->get(keys[size_t(r)]));
    auto& res = results[size_t(r)];
    in >> res.exit_code >> res.pid;
    in.get();
    std::getline(in, res.report, '\0');
  }
  // Process 0 serves the store: it must not leave (after the last test) while others still read.
  job.world->barrier();
  return results;
}

// Note [Fork before threads]: a process that forks while another of its threads holds a lock
// gives its child that lock, held forever (seen: AddressSanitizer's allocator lock, held by a
// store thread, deadlocked a forked rank until the harness killed it). So the store is served
// by a process of its own, forked while the test process runs no other thread, and the ranks
// are forked from that same thread-free test process.
class StoreProcess {
 public:
  StoreProcess() {
    int port_pipe[2], stop_pipe[2];
    if (pipe(port_pipe) != 0 || pipe(stop_pipe) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      close(port_pipe[0]);
      close(stop_pipe[1]);
      int code = 0;
      try {
        TcpStoreServer server("127.0.0.1", 0);
        const int port = server.port();
        (void)!write(port_pipe[1], &port, sizeof port);
        close(port_pipe[1]);
        char c;
        while (read(stop_pipe[0], &c, 1) > 0) {
        }  // until the test process closes the pipe, or dies
      } catch (const std::exception& e) {
        std::fprintf(stderr, "test harness: the store process failed: %s\n", e.what());
        code = 1;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    close(port_pipe[1]);
    close(stop_pipe[0]);
    stop_ = stop_pipe[1];
    const bool got = read(port_pipe[0], &port_, sizeof port_) == ssize_t(sizeof port_);
    close(port_pipe[0]);
    if (!got) throw std::runtime_error("the test harness's store process did not start");
  }
  ~StoreProcess() {
    close(stop_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int stop_ = -1;
  int port_ = 0;
};

}  // namespace

std::vector<std::string> test_backends() {
  if (mpi_job()) return {"mpi"};  // Note [Suites under mpirun]
#if CHORUS_HAVE_GLOO
  return {"shm", "tcp", "gloo"};
#else
  return {"shm", "tcp"};
#endif
}

std::vector<RankResult> run_ranks(int world, const std::function<void(RankContext&)>& body,
                                  std::chrono::seconds limit) {
  if (MpiJob* job = mpi_job()) return run_ranks_in_job(*job, world, body, limit);
  StoreProcess store;  // Note [Fork before threads]
  const int port = store.port();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const auto failure = run_body(body, [&] {
        return RankContext{r, world, std::make_shared<TcpStore>("127.0.0.1", port, std::chrono::seconds(60)), port};
      });
      if (failure && !failure->empty()) (void)!write(fds[1], failure->data(), failure->size());
      close(fds[1]);
      std::fflush(nullptr);
      _exit(failure ? 1 : 0);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<RankResult> results(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) results[size_t(r)].pid = pids[size_t(r)];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[size_t(r)] == 0) continue;
      int status = 0;
      pid_t got = waitpid(pids[size_t(r)], &status, WNOHANG);
      if (got == 0) continue;
      RankResult& res = results[size_t(r)];
      if (WIFEXITED(status))
        res.exit_code = WEXITSTATUS(status);
      else
        res.signal = WTERMSIG(status);
      char buf[4096];
      ssize_t n;
      while ((n = read(pipes[size_t(r)], buf, sizeof(buf))) > 0) res.report.append(buf, size_t(n));
      close(pipes[size_t(r)]);
      pids[size_t(r)] = 0;
      --remaining;
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (pids[size_t(r)] != 0) {
          kill(pids[size_t(r)], SIGKILL);
          results[size_t(r)].report = "the test harness killed this rank: it ran past the limit (hang?)";
        }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return results;
}

std::vector<RankResult> run_group(int world, const std::function<void(Communicator&)>& body,
                                  CommunicatorOptions options, std::chrono::seconds limit) {
  return run_ranks(
      world,
      [&](RankContext& ctx) {
        auto comm = Communicator::create(ctx.store, ctx.rank, ctx.world, options);
        body(*comm);
      },
      limit);
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& res = results[r];
    EXPECT_EQ(res.exit_code, 0) << "rank " << r << (res.signal ? " killed by signal " + std::to_string(res.signal) : "")
                                << ": " << res.report;
  }
}

std::vector<std::string> leftover_segments(const std::vector<RankResult>& ranks) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      for (const auto& r : ranks)
        if (std::string(e->d_name).rfind("chorus-" + std::to_string(r.pid) + "-", 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

void bind_to_cpu(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  RANK_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "cannot bind to CPU ", cpu);
}

}  // namespace chorus::test
