// Fabric::launch's supervision: a failing child is named, the other children are stopped, and
// rank 0 raises instead of hanging; nothing outlives the run.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <thread>

namespace {

struct Result {
  int code;
  std::string err;
};

Result run_probe(const std::vector<std::string>& args) {
  int e[2];
  if (pipe(e) != 0) throw std::runtime_error("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(e[1], 2);
    close(e[0]);
    std::vector<char*> argv{const_cast<char*>(FABRIC_LAUNCH_PROBE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(e[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(e[0], buf, sizeof(buf))) > 0;) err.append(buf, size_t(n));
  close(e[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
}

std::vector<int> pids_in(const std::string& dir) {
  std::vector<int> out;
  for (int r = 1; r < 3; ++r) {
    std::ifstream f(dir + "/" + std::to_string(r) + ".pid");
    int pid = 0;
    if (f >> pid) out.push_back(pid);
  }
  return out;
}

bool gone(int pid) {
  for (int i = 0; i < 150; ++i) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string a, b, state;
    if (!(f >> a >> b >> state) || state == "Z" || state == "X") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(FabricLaunch, StartsItsOwnRanks) {
  auto r = run_probe({});
  EXPECT_EQ(r.code, 0) << r.err;
}

void failing_child(const std::string& when) {
  char tmpl[] = "/tmp/fabric-launch-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto r = run_probe({"--fail-rank", "2", "--when", when, "--pid-dir", dir});
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(Fabric::launch: .*rank 2 \(pid \d+\) exited with code 5)")))
      << r.err;
  EXPECT_NE(r.err.find("rank 0 raised"), std::string::npos) << r.err;
  for (int pid : pids_in(dir)) EXPECT_TRUE(gone(pid)) << "child " << pid << " outlived the run";
}

TEST(FabricLaunch, ChildFailingDuringWorkIsNamedAndRankZeroRaises) { failing_child("work"); }
TEST(FabricLaunch, ChildFailingBeforeJoiningIsNamedAndRankZeroRaises) { failing_child("init"); }

}  // namespace
