// chorus-checkpoint-bench: saving and loading the training state of chorus-sharded-bench's model
// (Linear(4096,4096)-ReLU x6 then Linear(4096,10): 100.7M f32 parameters) with its Adam state,
// against the peers that would do the same job here, all in one run:
//   dd            the disk's own bandwidth: dd of the same number of bytes with conv=fsync
//   torch_save    one process holding everything, torch::save of the same tensors (then the same
//                 file fsynced, and torch::load of it)
//   chorus_*      W ranks with the model FullShard-ed: save_checkpoint in the sharded format (every
//                 rank writes its shards in parallel, fsync, metadata renamed in) and in the full
//                 format (rank 0 writes one file), then load_checkpoint of each
// Times are wall clock on rank 0 between barriers, the median of --repeat saves and loads; every
// chorus save includes its fsyncs (torch_save is printed without and with one). Loads read what
// was just written, so they come from the page cache, for chorus and torch alike.
#include <chorus/chorus.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include "mlp_model.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Adam's state exists after a step: take one with zero gradients.
void make_adam_state(torch::optim::Adam& opt) {
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) p.mutable_grad() = torch::zeros_like(p);
  opt.step();
}

int64_t adam_bytes(const std::vector<at::Tensor>& params) {
  int64_t b = 0;
  for (const auto& p : params) b += 3 * p.numel() * int64_t(p.element_size());  // values, exp_avg, exp_avg_sq
  return b;
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mib_s(int64_t bytes, double s) { return double(bytes) / (1 << 20) / s; }

void run_torch(int64_t h, const std::string& dir, int repeat) {
  auto model = make_mlp(h);
  torch::optim::Adam opt(model->parameters(), 1e-4);
  make_adam_state(opt);
  std::vector<at::Tensor> all;
  for (const auto& p : model->parameters()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    all.insert(all.end(), {p.detach(), s.exp_avg(), s.exp_avg_sq()});
  }
  const int64_t bytes = adam_bytes(model->parameters());
  const std::string path = dir + "/torch.pt";
  std::vector<double> save_s, save_sync_s, load_s;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    torch::save(all, path);
    save_s.push_back(since(t0));
    fsync_path(path);
    save_sync_s.push_back(since(t0));
    std::vector<at::Tensor> back;
    t0 = Clock::now();
    torch::load(back, path);
    load_s.push_back(since(t0));
    fs::remove(path);
  }
  std::printf(
      "torch_save world=1 bytes=%lld save_s=%.2f save_mib_s=%.0f save_fsync_s=%.2f save_fsync_mib_s=%.0f load_s=%.2f\n",
      (long long)bytes, median(save_s), mib_s(bytes, median(save_s)), median(save_sync_s),
      mib_s(bytes, median(save_sync_s)), median(load_s));
}

void run_chorus(int world, int64_t h, const std::string& dir, int repeat) {
  chorus::Fabric fabric({.devices = world});
  fabric.launch();
  auto model = make_mlp(h);
  chorus::ShardedDataParallel sdp(model.ptr());
  torch::optim::Adam opt(sdp.parameters(), 1e-4);
  make_adam_state(opt);
  const int64_t bytes = adam_bytes(model->parameters());
  chorus::CheckpointState state{{"model", sdp}, {"optimizer", opt}};
  for (auto format : {chorus::CheckpointFormat::Sharded, chorus::CheckpointFormat::Full}) {
    const bool sharded = format == chorus::CheckpointFormat::Sharded;
    const std::string path = dir + (sharded ? "/sharded" : "/full.pt");
    std::vector<double> save_s, load_s;
    for (int i = 0; i < repeat; ++i) {
      fabric.barrier();
      auto t0 = Clock::now();
      fabric.save(path, state, format);
      fabric.barrier();
      save_s.push_back(since(t0));
      t0 = Clock::now();
      fabric.load(path, state);
      fabric.barrier();
      load_s.push_back(since(t0));
      if (fabric.is_global_zero()) fs::remove_all(path);
    }
    if (fabric.is_global_zero())
      std::printf("chorus_%s world=%d bytes=%lld save_s=%.2f save_mib_s=%.0f load_s=%.2f load_mib_s=%.0f\n",
                  sharded ? "sharded" : "full", world, (long long)bytes, median(save_s), mib_s(bytes, median(save_s)),
                  median(load_s), mib_s(bytes, median(load_s)));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-checkpoint-bench: save/load of a sharded model with Adam state vs torch::save and dd"};
  int world = 4, repeat = 3;
  int64_t h = 4096;
  std::string dir = "/tmp/chorus-checkpoint-bench", mode;
  app.add_option("--world,--np", world, "ranks for the chorus runs")->check(CLI::PositiveNumber);
  app.add_option("--hidden", h, "width H (4096: 100.7M parameters)")->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "saves and loads per peer (the median is printed)")->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "where the files go (on the disk to measure)");
  app.add_option("--mode", mode, "(internal) torch or chorus");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  if (mode == "torch") {
    run_torch(h, dir, repeat);
    return 0;
  }
  if (mode == "chorus" || std::getenv("RANK") || std::getenv("CHORUS_RANK")) {
    run_chorus(world, h, dir, repeat);
    return 0;
  }
  fs::create_directories(dir);
  const int64_t params = mlp_params(h), bytes = 3 * 4 * params;
  std::printf("# chorus-checkpoint-bench: %.1fM parameters + Adam state = %.2f GiB, world=%d, in %s\n", params / 1e6,
              double(bytes) / (1 << 30), world, dir.c_str());
  std::fflush(stdout);
  const int64_t mib = bytes >> 20;
  auto t0 = Clock::now();
  const std::string dd = "dd if=/dev/zero of=" + dir + "/dd bs=1M count=" + std::to_string(mib) +
                         " conv=fsync status=none && rm -f " + dir + "/dd";
  if (std::system(dd.c_str()) != 0) return 1;
  const double dd_s = since(t0);
  std::printf("dd bytes=%lld seconds=%.2f mib_s=%.0f\n", (long long)(mib << 20), dd_s, mib_s(mib << 20, dd_s));
  std::fflush(stdout);
  const std::string self =
      std::string(argv[0]) + " --hidden " + std::to_string(h) + " --dir " + dir + " --repeat " + std::to_string(repeat);
  int failed = std::system((self + " --mode torch").c_str()) != 0;
  failed += std::system((self + " --mode chorus --world " + std::to_string(world)).c_str()) != 0;
  return failed ? 1 : 0;
}
