// Fabric::launch under test: starts 3 ranks itself; one of them fails on request.
//   fabric_launch_probe [--fail-rank R] [--when init|work] [--pid-dir D]
#include <chorus/chorus.h>

#include <unistd.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  int fail_rank = -1;
  std::string when = "work", pid_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--fail-rank") fail_rank = std::stoi(argv[i + 1]);
    if (k == "--when") when = argv[i + 1];
    if (k == "--pid-dir") pid_dir = argv[i + 1];
  }
  chorus::Fabric fabric({.devices = 3, .timeout = std::chrono::seconds(60)});
  const int rank_before = std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : 0;
  if (!pid_dir.empty() && rank_before > 0) {
    FILE* f = std::fopen((pid_dir + "/" + std::to_string(rank_before) + ".pid").c_str(), "w");
    std::fprintf(f, "%d\n", int(getpid()));
    std::fclose(f);
  }
  if (rank_before == fail_rank && when == "init") return 5;
  try {
    fabric.launch();
    if (!pid_dir.empty() && fabric.global_rank() > 0) {
      FILE* f = std::fopen((pid_dir + "/" + std::to_string(fabric.global_rank()) + ".pid").c_str(), "w");
      std::fprintf(f, "%d\n", int(getpid()));
      std::fclose(f);
    }
    for (int i = 0; i < 200; ++i) {
      if (fabric.global_rank() == fail_rank && i == 50) return 5;
      at::Tensor t = at::ones({4});
      fabric.all_reduce(t, nullptr, chorus::ReduceOp::Sum);
      if (i > 40) usleep(2000);
    }
    fabric.barrier();
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "rank %d raised: %s\n", fabric.global_rank(), e.what());
    return 9;
  }
  std::printf("rank %d done\n", fabric.global_rank());
  return 0;
}
