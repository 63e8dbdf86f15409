// A chorus program for the launcher tests (torch-free): meets its peers the way the launcher
// says, checks an all_reduce, prints one line, and misbehaves on request.
//   launch_probe [--exit-rank R --code C] [--signal-rank R] [--fail-until-restart K]
//                [--lines N] [--sleep S] [--pid-dir D]
#include <signal.h>
#include <unistd.h>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "chorus/core/communicator.h"
#include "chorus/core/environment.h"
#include "chorus/core/rendezvous.h"

int main(int argc, char** argv) {
  int exit_rank = -1, code = 3, signal_rank = -1, fail_until = 0, lines = 0;
  double sleep_s = 0;
  std::string pid_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--exit-rank")
      exit_rank = std::stoi(v);
    else if (k == "--code")
      code = std::stoi(v);
    else if (k == "--signal-rank")
      signal_rank = std::stoi(v);
    else if (k == "--fail-until-restart")
      fail_until = std::stoi(v);
    else if (k == "--lines")
      lines = std::stoi(v);
    else if (k == "--sleep")
      sleep_s = std::stod(v);
    else if (k == "--pid-dir")
      pid_dir = v;
  }
  const auto env = chorus::Environment::detect();
  if (!pid_dir.empty()) {
    const std::string path = pid_dir + "/" + std::to_string(env.rank) + ".pid";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f, "%d\n", int(getpid()));
      std::fclose(f);
    }
  }
  auto comm = chorus::Communicator::create(chorus::connect_store(env), env.rank, env.world_size,
                                           {.timeout = std::chrono::seconds(60)});
  int64_t sum = env.rank;
  comm->all_reduce(&sum, &sum, 1, chorus::DataType::Int64, chorus::ReduceOp::Sum);
  const bool ok = sum == int64_t(env.world_size) * (env.world_size - 1) / 2;
  std::printf("probe rank=%d world=%d local=%d/%d node=%d launcher=%s restart=%d sum=%s\n", env.rank, env.world_size,
              env.local_rank, env.local_world_size, env.node_rank, std::string(chorus::to_string(env.launcher)).c_str(),
              env.restart_count, ok ? "ok" : "WRONG");
  std::fflush(stdout);
  const std::string filler(120, char('a' + env.rank % 26));
  for (int i = 0; i < lines; ++i) std::printf("line rank=%d i=%d %s\n", env.rank, i, filler.c_str());
  std::fflush(stdout);
  if (env.rank == exit_rank) return code;
  if (env.rank == signal_rank) {
    std::signal(SIGSEGV, SIG_DFL);  // die by the signal even where a sanitizer handles SIGSEGV
    raise(SIGSEGV);
  }
  if (env.rank == 1 && env.restart_count < fail_until) {
    std::fprintf(stderr, "probe: rank 1 fails in attempt %d\n", env.restart_count);
    return 4;
  }
  if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  comm->barrier();
  return ok ? 0 : 2;
}
