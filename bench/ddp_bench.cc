// chorus-ddp-bench: step time of the reference MLP (Linear(2048,2048)-ReLU x3, Linear(2048,10):
// 12.6M parameters) under chorus's DistributedDataParallel, the workload of
// bench/peers/torch_ddp.py (per-rank batch 64, SGD lr 0.01, synthetic data seeded by
// rank, one intra-op thread, 5 warm-up and 30 timed steps). Also runs it with gradient sync only
// after backward (no overlap) and without any sync, to show how much communication backward hides.
// Starts its own ranks (Fabric::launch) unless a launcher did.
#include <chorus/chorus.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

using Clock = std::chrono::steady_clock;

torch::nn::Sequential reference_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(2048, 2048), torch::nn::ReLU(), torch::nn::Linear(2048, 2048),
                               torch::nn::ReLU(), torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                               torch::nn::Linear(2048, 10));
}

enum class Mode { Overlap, AfterBackward, Local };
constexpr Mode kModes[] = {Mode::Overlap, Mode::AfterBackward, Mode::Local};
constexpr const char* kNames[] = {"ddp_overlap", "ddp_sync_after_backward", "local_no_sync"};

// Per mode: median and p90 step time (ms) on this rank. The modes take turns step by step, so
// the machine's drift (it is shared and noisy) weighs on all of them alike.
std::vector<std::pair<double, double>> run(chorus::Fabric& fabric, int warmup, int steps, double bucket_mb) {
  const int rank = fabric.global_rank();
  auto model = reference_mlp();
  auto& ddp = fabric.setup(model, chorus::DDPOptions{.bucket_cap_mb = bucket_mb});
  torch::optim::SGD opt(model->parameters(), 0.01);
  auto gen = at::detail::createCPUGenerator(uint64_t(rank));
  at::Tensor x = at::randn({64, 2048}, gen), y = at::randint(0, 10, {64}, gen);
  std::vector<std::vector<double>> ms(3);
  for (int i = 0; i < (warmup + steps) * 3; ++i) {
    const Mode mode = kModes[i % 3];
    chorus::barrier();
    const auto t0 = Clock::now();
    opt.zero_grad();
    {
      auto guard = fabric.no_backward_sync(ddp, mode != Mode::Overlap);
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    }
    if (mode == Mode::AfterBackward) {  // the same averaging, started only once backward is over
      for (auto& p : model->parameters()) {
        at::Tensor g = p.mutable_grad();
        chorus::default_group()->all_reduce_(g, chorus::ReduceOp::Mean);
      }
    }
    opt.step();
    if (i / 3 >= warmup) ms[i % 3].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::vector<std::pair<double, double>> out;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    out.emplace_back(v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 9 / 10)]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-ddp-bench: DDP step time of the reference MLP, with and without overlap"};
  int np = 2, warmup = 5, steps = 30;
  double bucket_mb = 25;
  app.add_option("--np", np, "ranks to start when no launcher did")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", bucket_mb, "DDPOptions::bucket_cap_mb")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  chorus::Fabric fabric({.devices = np});
  fabric.launch();
  fabric.print("# chorus-ddp-bench: world", fabric.world_size(), " params 12.6M  batch 64/rank  bucket_mb", bucket_mb);
  fabric.print("mode median_ms p90_ms");
  auto results = run(fabric, warmup, steps, bucket_mb);
  for (size_t m = 0; m < results.size(); ++m)
    if (fabric.is_global_zero()) std::printf("%s %.2f %.2f\n", kNames[m], results[m].first, results[m].second);
  std::fflush(stdout);
  fabric.barrier();
  return 0;
}
