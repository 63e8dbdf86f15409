// chorus-sharded-bench: step time, peak RSS and model-state bytes of sharded data parallel, the
// workload of bench/peers/torch_zero.py: Linear(H,H)-ReLU x6 then Linear(H,10)
// (H = 4096: 100.7M parameters, f32), Adam lr 1e-4, per-rank batch 16 seeded by rank, one
// intra-op thread, 2 warm-up and 8 timed steps. One line per mode:
//   <mode> world=<W> params=<n> median_ms=<x> peak_rss_mib=<x> model_state_mib=<x>
// Modes: ddp (chorus DDP), shard_grad_op, full_shard (the whole module one unit),
// full_shard_units (each Linear a unit). Each mode runs in fresh processes, so peak RSS is its
// own. --params picks H for another size (400M: H = 8192); unless --modes names it, a mode whose
// estimated memory exceeds what the machine has available is skipped with a line that says so.
// --layers L --width H: L hidden layers of width H instead (--layers 600 --width 64: 1,202
// parameter tensors, where any per-parameter cost of the sharded engine shows).
#include <chorus/chorus.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fstream>
#include <sstream>
#include "mlp_model.h"

namespace {

using Clock = std::chrono::steady_clock;
const char* const kModes[] = {"ddp", "shard_grad_op", "full_shard", "full_shard_units"};

// The width, a multiple of 64, whose model has about `params` parameters.
int64_t width_for(double params) { return std::max<int64_t>(64, 64 * std::llround(std::sqrt(params / 6.0) / 64)); }

double parse_count(const std::string& s) {
  double v = std::stod(s);
  const char unit = s.empty() ? ' ' : char(std::toupper(s.back()));
  return unit == 'K' ? v * 1e3 : unit == 'M' ? v * 1e6 : unit == 'G' ? v * 1e9 : v;
}

double available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stod(line.substr(13)) * 1024;  // "... kB"
  return 0;
}

// Bytes per rank a mode needs at its peak, roughly (f32 Adam: 16 per parameter replicated). Every
// rank first builds the whole model (4 per parameter) before setting it up.
double estimate(const std::string& mode, double psi, int w, int64_t h) {
  const double unit = 4.0 * double(h * h + h), built = 4 * psi + 4 * psi / w;
  double need = 0;
  if (mode == "ddp")
    need = 16 * psi;
  else if (mode == "full_shard_units")
    need = 16 * psi / w + 4 * unit;  // units in flight, their gradients
  else
    need = 8 * psi + 16 * psi / w;  // the whole model gathered with its gradients
  return 1.2 * std::max(need, built);
}

int64_t optimizer_bytes(torch::optim::Adam& opt) {
  int64_t b = 0;
  for (auto& [key, state] : opt.state()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*state);
    b += (s.exp_avg().numel() + s.exp_avg_sq().numel()) * 4;
    if (s.max_exp_avg_sq().defined()) b += s.max_exp_avg_sq().numel() * 4;
  }
  return b;
}

void run_mode(chorus::Fabric& fabric, const std::string& mode, int64_t h, int layers, int warmup, int steps) {
  const int rank = fabric.global_rank();
  auto model = make_mlp(h, layers);
  std::unique_ptr<chorus::DistributedDataParallel> ddp;
  std::unique_ptr<chorus::ShardedDataParallel> sdp;
  std::vector<at::Tensor> params;
  if (mode == "ddp") {
    ddp = std::make_unique<chorus::DistributedDataParallel>(model.ptr());
    params = model->parameters();
  } else {
    chorus::ShardedOptions o;
    o.strategy = mode == "shard_grad_op" ? chorus::ShardingStrategy::ShardGradOp : chorus::ShardingStrategy::FullShard;
    if (mode == "full_shard_units") o.units = chorus::units_of_size(model.ptr(), 1);
    sdp = std::make_unique<chorus::ShardedDataParallel>(model.ptr(), o);
    params = sdp->parameters();
  }
  torch::optim::Adam opt(params, 1e-4);
  auto gen = at::detail::createCPUGenerator(uint64_t(rank));
  at::Tensor x = at::randn({16, h}, gen), y = at::randint(0, 10, {16}, gen);
  std::vector<double> ms;
  for (int i = 0; i < warmup + steps; ++i) {
    fabric.barrier();
    const auto t0 = Clock::now();
    opt.zero_grad();
    auto loss = [&] { return torch::nn::functional::cross_entropy(model->forward(x), y); };
    (sdp ? sdp->forward(loss) : loss()).backward();
    opt.step();
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (fabric.is_global_zero() && steps <= 3)
      std::fprintf(stderr, "# %s step %d/%d: %.0f ms\n", mode.c_str(), i + 1, warmup + steps,
                   std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  int64_t state = optimizer_bytes(opt);
  if (sdp) {
    auto m = sdp->memory_stats();
    state += m.shard_bytes + m.shard_grad_bytes + m.full_bytes + m.full_grad_bytes;
  } else {
    for (const auto& p : params) state += p.numel() * 4 + (p.grad().defined() ? p.grad().numel() * 4 : 0);
  }
  std::sort(ms.begin(), ms.end());
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  // Rank 0's line, as the anchor prints rank 0's; the largest RSS over ranks goes with it.
  at::Tensor rss = at::tensor({double(usage.ru_maxrss) / 1024}, at::kDouble);
  chorus::default_group()->all_reduce_(rss, chorus::ReduceOp::Max);
  if (fabric.is_global_zero())
    std::printf("%s world=%d params=%lld median_ms=%.1f peak_rss_mib=%.0f model_state_mib=%.0f\n", mode.c_str(),
                fabric.world_size(), (long long)mlp_params(h, layers), ms[ms.size() / 2], rss.item<double>(),
                double(state) / (1 << 20));
  std::fflush(stdout);
  fabric.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-sharded-bench: DDP and sharded data parallel on a Linear-ReLU MLP"};
  int world = 2, warmup = 2, steps = 8, layers = 6;
  int64_t width = 0;
  std::string params = "100.7M", modes = "ddp,shard_grad_op,full_shard,full_shard_units", mode;
  app.add_option("--world,--np", world, "ranks to start when no launcher did")->check(CLI::PositiveNumber);
  app.add_option("--params", params, "model size (100.7M: H=4096; 400M: H=8192)");
  app.add_option("--modes", modes, "comma-separated: ddp, shard_grad_op, full_shard, full_shard_units");
  app.add_option("--warmup", warmup, "untimed steps")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "hidden Linear(H,H) layers")->check(CLI::PositiveNumber);
  app.add_option("--width", width, "H (default: from --params)")->check(CLI::PositiveNumber);
  app.add_option("--mode", mode, "(internal) run this one mode in this set of ranks");
  CLI11_PARSE(app, argc, argv);
  const bool modes_given = app.count("--modes") > 0;
  const int64_t h = width ? width : width_for(parse_count(params) * 6 / layers);
  const double psi = double(mlp_params(h, layers));

  if (mode.empty() && std::getenv("RANK") == nullptr && std::getenv("CHORUS_RANK") == nullptr) {
    // One fresh set of ranks per mode, so each peak RSS is that mode's.
    std::printf("# chorus-sharded-bench: world=%d H=%lld layers=%d params=%.1fM batch 16/rank Adam, %d+%d steps\n",
                world, (long long)h, layers, psi / 1e6, warmup, steps);
    std::fflush(stdout);
    std::stringstream list(modes);
    std::string m;
    int failed = 0;
    while (std::getline(list, m, ',')) {
      if (std::find(std::begin(kModes), std::end(kModes), m) == std::end(kModes)) {
        std::fprintf(stderr, "chorus-sharded-bench: unknown mode '%s'\n", m.c_str());
        return 2;
      }
      const double need = estimate(m, psi, world, h) * world, have = available_bytes();
      if (!modes_given && have > 0 && need > 0.85 * have) {
        std::printf(
            "%s world=%d params=%lld skipped: needs about %.1f GiB, %.1f GiB available (--modes runs it anyway)\n",
            m.c_str(), world, (long long)psi, need / (1 << 30), have / (1 << 30));
        std::fflush(stdout);
        continue;
      }
      std::string cmd = std::string(argv[0]) + " --world " + std::to_string(world) + " --width " + std::to_string(h) +
                        " --layers " + std::to_string(layers) + " --warmup " + std::to_string(warmup) + " --steps " +
                        std::to_string(steps) + " --mode " + m;
      if (std::system(cmd.c_str()) != 0) ++failed;
    }
    return failed ? 1 : 0;
  }
  at::set_num_threads(1);
  chorus::Fabric fabric({.devices = world});
  fabric.launch();
  run_mode(fabric, mode.empty() ? std::string("full_shard_units") : mode, h, layers, warmup, steps);
  return 0;
}
