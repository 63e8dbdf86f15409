#include "multiprocess.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "chorus/core/tcp_store.h"

namespace chorus::test {

std::vector<std::string> test_backends() {
#if CHORUS_HAVE_GLOO
  return {"shm", "gloo"};
#else
  return {"shm"};
#endif
}

std::vector<RankResult> run_ranks(int world, const std::function<void(RankContext&)>& body,
                                  std::chrono::seconds limit) {
  TcpStoreServer server("127.0.0.1", 0);
  const int port = server.port();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string report;
      int code = 0;
      try {
        RankContext ctx{r, world, std::make_shared<TcpStore>("127.0.0.1", port, std::chrono::seconds(60)), port};
        body(ctx);
      } catch (const std::exception& e) {
        report = e.what();
        code = 1;
      }
      if (!report.empty()) (void)!write(fds[1], report.data(), report.size());
      close(fds[1]);
      std::fflush(nullptr);
      _exit(code);
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
      if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
      else res.signal = WTERMSIG(status);
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

}  // namespace chorus::test
