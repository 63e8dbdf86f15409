// The main job: trains a small classifier with DDP (or FullShard: --strategy fsdp) on a
// synthetic dataset.
//
//   chorusrun --nproc-per-node 4 build/examples/train_ddp     (scripts/demo.sh does this)
//   build/examples/train_ddp --devices 4                       (Fabric::launch starts them)
//   chorusrun --nproc-per-node 3 --max-restarts 1 build/examples/train_ddp --checkpoint-every 50
//       (a sharded checkpoint every 50 steps; a restarted or re-run job resumes from the last one)
//
// Rank 0 makes the dataset (deterministic: 10 Gaussian classes in 64 dimensions) while the others
// wait (rank_zero_first), then broadcasts it; every rank trains on its own shard with gradients
// averaged by DistributedDataParallel; evaluation gathers the predictions and reduces the metrics
// across ranks; rank 0 prints progress and the summary, which ends with a SHA-256 of the final
// parameters. The final model is saved as one torch.save-compatible file. Under DDP the ranks
// also check that their parameters are identical, bit for bit.
// Resuming: the data order comes from a DistributedSampler (shuffled by epoch) whose position the
// checkpoint keeps with the model, the optimizer and the step, so a resumed run ends with exactly
// the parameters of an uninterrupted one, and one resumed at another world size (an elastic job
// that lost or gained a node: chorusrun --nnodes MIN:MAX) trains on every remaining sample of
// the epoch once. Under an elastic chorusrun the ranks also look for nodes waiting to join at each
// checkpoint and, if one waits, leave for a new round that takes it in.
#include <chorus/chorus.h>
#include <chorus/core/digest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kClasses = 10, kDim = 64;

c10::IValue make_dataset(int64_t train, int64_t test, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor centers = at::randn({kClasses, kDim}, gen) * 0.8;
  auto draw = [&](int64_t n) {
    at::Tensor y = at::randint(0, kClasses, {n}, gen);
    at::Tensor x = centers.index_select(0, y) + at::randn({n, kDim}, gen) * 2.5;
    return std::make_pair(x, y);
  };
  auto [xtr, ytr] = draw(train);
  auto [xte, yte] = draw(test);
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  d.insert("x_train", xtr);
  d.insert("y_train", ytr);
  d.insert("x_test", xte);
  d.insert("y_test", yte);
  return d;
}

// Rank 0's progress line: a bar, the running loss and the throughput of the whole job.
class Progress {
 public:
  Progress(bool on, int epochs) : on_(on), tty_(isatty(STDOUT_FILENO)), epochs_(epochs) {}
  bool tty() const { return tty_; }
  void update(int epoch, double fraction, double loss, double samples_per_s) {
    if (!on_) return;
    const int tenth = int(fraction * 10);
    if (!tty_ && tenth == last_tenth_ && fraction < 1) return;  // logs: every 10%
    last_tenth_ = tenth;
    const int width = 30, filled = int(fraction * width);
    std::string bar(size_t(filled), '#');
    bar += std::string(size_t(width - filled), '.');
    std::printf("%sepoch %d/%d [%s] %3.0f%%  loss %.4f  %8.0f samples/s%s", tty_ ? "\r" : "", epoch, epochs_,
                bar.c_str(), fraction * 100, loss, samples_per_s, tty_ && fraction < 1 ? "" : "\n");
    std::fflush(stdout);
  }

 private:
  bool on_, tty_;
  int epochs_;
  int last_tenth_ = -1;
};

// Wall-clock milliseconds, for the time a recovery took (tests/elastic_hosts.sh reads it).
long long unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

torch::nn::Sequential make_model() {
  chorus::set_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(kDim, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, kClasses));
}

// The same training under chorus::elastic::run: the model, optimizer, step and sampler live
// outside the group; each group (the first, and each after a peer failed or a node joined) goes on
// from the state, which a commit every `commit_every` steps keeps in memory. Under "ddp" each group
// wraps the model in DDP again; under "fsdp" the model is sharded once (FullShard) and run() moves
// its shards onto each new group. The same data, model and arithmetic as the Fabric path, so the
// two agree bit for bit at the same world sizes.
int train_in_process(const std::string& strategy, int epochs, int batch, int64_t train_size, double lr,
                     int64_t commit_every, bool log_steps) {
  const auto d = make_dataset(train_size, 1, /*seed=*/2026).toGenericDict();  // every rank the same
  const at::Tensor x_train = d.at("x_train").toTensor(), y_train = d.at("y_train").toTensor();
  torch::nn::Sequential model = make_model();
  std::unique_ptr<chorus::ShardedDataParallel> sdp;
  if (strategy == "fsdp") {
    chorus::init_process_group();  // (elastic::run goes on with it)
    sdp = std::make_unique<chorus::ShardedDataParallel>(model.ptr());
  }
  torch::optim::SGD opt(sdp ? sdp->parameters() : model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  chorus::DistributedSampler sampler(train_size, 1, 0, {.shuffle = true, .seed = 0, .drop_last = true});
  sampler.set_epoch(1);
  int64_t step = 0;
  chorus::elastic::State state{{"model", model}, {"optimizer", opt}, {"step", step}, {"sampler", sampler}};
  int groups = 0;
  chorus::elastic::run(state, [&](chorus::ProcessGroup& world) {
    std::optional<chorus::DistributedDataParallel> ddp;
    if (!sdp) ddp.emplace(model.ptr());
    auto forward = [&](const at::Tensor& x) {
      return sdp ? sdp->forward([&] { return model->forward(x); }) : model->forward(x);
    };
    sampler.set_replicas(world.size(), world.rank());
    ++groups;  // on every rank: a survivor that becomes rank 0 counts as the others do
    if (world.rank() == 0)
      std::printf("in-process: group %d of %d ranks from step %lld (epoch %lld at sample %lld; %.1f MB committed)\n",
                  groups, world.size(), (long long)step, (long long)sampler.epoch(), (long long)sampler.position(),
                  double(state.memory_bytes()) / 1e6),
          std::fflush(stdout);
    bool first = true;
    for (int epoch = int(sampler.epoch()); epoch <= epochs; sampler.set_epoch(++epoch)) {
      const at::Tensor order = sampler.indices();
      for (int64_t s = 0; s < order.size(0) / batch; ++s) {
        at::Tensor idx = order.slice(0, s * batch, (s + 1) * batch);
        opt.zero_grad();
        at::Tensor loss =
            torch::nn::functional::cross_entropy(forward(x_train.index_select(0, idx)), y_train.index_select(0, idx));
        loss.backward();
        opt.step();
        ++step;
        sampler.advance(batch);
        if (first && world.rank() == 0) std::printf("first step of group %d done at unix ms %lld\n", groups, unix_ms());
        if (log_steps && world.rank() == 0) std::printf("step %lld done at unix ms %lld\n", (long long)step, unix_ms());
        first = false;
        if (commit_every > 0 && step % commit_every == 0) {
          state.commit();
          if (world.rank() == 0) std::printf("commit: step %lld\n", (long long)step), std::fflush(stdout);
        }
      }
    }
  });
  auto world = chorus::default_group();
  at::Tensor params;
  {
    chorus::GatheredParameters full({model.ptr()});  // a no-op for replicas
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape(-1).clone());
    params = at::cat(flat);
  }
  at::Tensor first = params.clone();
  world->broadcast_(first, 0);
  at::Tensor differ = torch::tensor(int64_t(!at::equal(params, first)));
  world->all_reduce_(differ);
  if (world->rank() == 0) {
    std::printf("in-process: %lld steps, %d group(s); %s %s\n", (long long)step, groups,
                sdp ? "parameters gathered from the shards," : "replicas",
                differ.item<int64_t>() == 0 ? "identical on every rank, bit for bit" : "DIFFER");
    std::printf("parameters sha256 %s\n",
                chorus::sha256_hex(params.data_ptr(), size_t(params.numel()) * params.element_size()).c_str());
  }
  world->barrier();
  sdp.reset();
  chorus::destroy_process_group();
  return differ.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace

int train(int argc, char** argv) {
  CLI::App app{"train_ddp: a small classifier trained with chorus DDP on a synthetic dataset"};
  int devices = 4, epochs = 5, batch = 64;
  int64_t train_size = 200000, test_size = 20000;
  double lr = 0.05;
  std::string out_dir = "/tmp/chorus-train-ddp", strategy = "ddp", checkpoint_dir;
  int64_t checkpoint_every = 0, max_steps = 0;
  app.add_option("--devices", devices, "processes to start when no launcher did")->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--train-size", train_size)->check(CLI::PositiveNumber);
  app.add_option("--test-size", test_size)->check(CLI::PositiveNumber);
  app.add_option("--lr", lr);
  app.add_option("--out", out_dir, "where the final model is written (model.pt)");
  app.add_option("--strategy", strategy, "ddp, or fsdp (FullShard: parameters, gradients, Adam state sharded)")
      ->check(CLI::IsMember({"ddp", "fsdp"}));
  app.add_option("--checkpoint-every", checkpoint_every, "save a sharded checkpoint every N steps (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", max_steps, "stop after this many steps in all (0: train every epoch)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "where checkpoints go (default <out>/checkpoint); a run started on one resumes from it");
  bool in_process = false, log_steps = false;
  app.add_flag("--log-steps", log_steps, "rank 0 prints 'step S done at unix ms T' after every step");
  app.add_flag("--in-process", in_process,
               "elastic in-process recovery (chorus::elastic::run; ddp or fsdp): a commit in memory every "
               "--checkpoint-every steps; a lost peer costs the steps since, not a restart");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);  // ranks share the cores
  if (in_process) return train_in_process(strategy, epochs, batch, train_size, lr, checkpoint_every, log_steps);

  if (checkpoint_dir.empty()) checkpoint_dir = out_dir + "/checkpoint";
  chorus::Fabric fabric({.devices = devices, .strategy = strategy});
  fabric.launch();
  const int rank = fabric.global_rank(), world = fabric.world_size();
  const auto t_start = Clock::now();
  fabric.print("train_ddp:", world, "ranks |", strategy, "|", train_size, "training samples |", epochs,
               "epochs | batch", batch, "per rank");

  // The dataset: made once on rank 0 while the others wait, then broadcast to everyone.
  c10::IValue data;
  fabric.rank_zero_first([&] {
    if (rank == 0) data = make_dataset(train_size, test_size, /*seed=*/2026);
  });
  auto d = fabric.broadcast(data, 0).toGenericDict();
  const at::Tensor x_train = d.at("x_train").toTensor(), y_train = d.at("y_train").toTensor();
  const at::Tensor x_test = d.at("x_test").toTensor(), y_test = d.at("y_test").toTensor();

  torch::nn::Sequential model = make_model();
  // Under "ddp" replicas (DDP inside), under "fsdp" shards: the same loop serves both.
  auto& sdp = fabric.setup_module(model);
  torch::optim::SGD opt(sdp.parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  auto forward = [&](const at::Tensor& x) { return sdp.forward([&] { return model->forward(x); }); };

  // Each rank's shard: every world-th sample of the epoch's permutation (seed = epoch), the tail
  // dropped so that all ranks take as many steps.
  Progress progress(fabric.is_global_zero(), epochs);
  chorus::DistributedSampler sampler(train_size, world, rank, {.shuffle = true, .seed = 0, .drop_last = true});
  sampler.set_epoch(1);
  int64_t step = 0;  // steps taken in all, across epochs and world sizes
  chorus::CheckpointState state{{"model", sdp}, {"optimizer", opt}, {"step", step}, {"sampler", sampler}};
  bool resumed = false;
  if (std::filesystem::exists(checkpoint_dir + "/metadata")) {
    resumed = true;
    fabric.load(checkpoint_dir, state);
    sampler.set_replicas(world, rank);  // the rest of the epoch, dealt out over this run's ranks
    fabric.print("resumed from step", step, "(epoch", sampler.epoch(), "at sample", sampler.position(), "of",
                 train_size, ") at", world, "ranks (" + checkpoint_dir + ")");
  }
  const int64_t resumed_epoch = sampler.epoch();
  int64_t samples_seen = 0;
  bool leaving = false;  // for a new round: nodes wait to join
  const auto t_train = Clock::now();
  for (int epoch = int(sampler.epoch()); epoch <= epochs && !leaving; sampler.set_epoch(++epoch)) {
    const at::Tensor order = sampler.indices();
    const int64_t steps = order.size(0) / batch;
    const int64_t epoch_steps = (train_size / world) / batch, done_before = epoch_steps - steps;
    double running = 0;
    for (int64_t s = 0; s < steps && !leaving; ++s) {
      if (max_steps > 0 && step >= max_steps) break;
      at::Tensor idx = order.slice(0, s * batch, (s + 1) * batch);
      opt.zero_grad();
      at::Tensor loss =
          torch::nn::functional::cross_entropy(forward(x_train.index_select(0, idx)), y_train.index_select(0, idx));
      loss.backward();  // gradients averaged (DDP) or reduce-scattered into the shards (fsdp) here
      opt.step();
      ++step;
      sampler.advance(batch);
      if (s == 0 && epoch == int(resumed_epoch) && resumed)
        fabric.print("first step after resuming done at unix ms", unix_ms());
      if (log_steps) fabric.print("step", step, "done at unix ms", unix_ms());
      running = running == 0 ? loss.item<double>() : 0.95 * running + 0.05 * loss.item<double>();
      samples_seen += batch * world;
      const double secs = std::chrono::duration<double>(Clock::now() - t_train).count();
      progress.update(epoch, double(done_before + s + 1) / double(std::max<int64_t>(epoch_steps, 1)), running,
                      double(samples_seen) / secs);
      if (checkpoint_every > 0 && step % checkpoint_every == 0) {
        fabric.save(checkpoint_dir, state, chorus::CheckpointFormat::Sharded);
        if (!progress.tty()) fabric.print("checkpoint: step", step, "->", checkpoint_dir);
        if (chorus::elastic::nodes_waiting(chorus::default_group()->communicator()) > 0) {
          fabric.print("step", step, ": nodes wait to join; leaving for a new round");
          chorus::elastic::request_new_round(chorus::default_group()->communicator());
          leaving = true;
        }
      }
    }
    if (max_steps > 0 && step >= max_steps) break;
  }
  if (leaving) return 0;
  if (max_steps > 0 && step >= max_steps) {
    fabric.print("stopped after step", step, "(--max-steps)");
    return 0;
  }
  const double train_secs = std::chrono::duration<double>(Clock::now() - t_train).count();
  torch::NoGradGuard no_grad;

  // The final parameters: gathered when sharded; fingerprinted on rank 0. Under DDP the replicas
  // must also agree bit for bit: every rank compares its parameters with rank 0's.
  at::Tensor params;
  {
    chorus::GatheredParameters full({model.ptr()});  // a no-op under DDP
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.reshape(-1).clone());
    params = at::cat(flat);
  }
  const std::string fingerprint = chorus::sha256_hex(params.data_ptr(), size_t(params.numel()) * params.element_size());
  const int64_t differ =
      fabric.all_reduce(torch::tensor(int64_t(!at::equal(params, fabric.broadcast(params, 0)))), nullptr, "sum")
          .item<int64_t>();

  // Evaluation: every rank scores its shard; predictions are gathered on rank 0, metrics reduced.
  at::Tensor mine = at::arange(rank, test_size, world);
  at::Tensor logits = forward(x_test.index_select(0, mine));
  at::Tensor preds = logits.argmax(1);
  c10::impl::GenericDict metrics(c10::StringType::get(), c10::AnyType::get());
  metrics.insert("correct", preds.eq(y_test.index_select(0, mine)).sum().item<int64_t>());
  metrics.insert("count", mine.numel());
  metrics.insert("loss_sum", torch::nn::functional::cross_entropy(
                                 logits, y_test.index_select(0, mine),
                                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                                 .item<double>());
  auto totals = fabric.all_reduce(c10::IValue(metrics), nullptr, chorus::ReduceOp::Sum).toGenericDict();
  auto all_preds = chorus::gather(preds);  // concatenated on rank 0: per-class accuracy there
  const double accuracy = double(totals.at("correct").toInt()) / double(totals.at("count").toInt());
  const double test_loss = totals.at("loss_sum").toDouble() / double(totals.at("count").toInt());

  // The final model as one file (rank 0 writes it; sharded parameters are gathered one at a time):
  // torch.load / torch::pickle_load read it as {"model": {name: tensor}}.
  fabric.save(out_dir + "/model.pt", {{"model", sdp}}, chorus::CheckpointFormat::Full);
  if (fabric.is_global_zero()) {
    std::vector<at::Tensor> owners;
    for (int r = 0; r < world; ++r) owners.push_back(at::arange(r, test_size, world));
    at::Tensor truth = y_test.index_select(0, at::cat(owners));
    at::Tensor hit = all_preds->eq(truth);
    std::string per_class;
    for (int64_t c = 0; c < kClasses; ++c) {
      at::Tensor in_class = truth.eq(c);
      const int percent = int(100 * hit.masked_select(in_class).to(at::kFloat).mean().item<float>());
      per_class += (c ? " " : "") + std::to_string(percent);
    }
    std::printf("per-class accuracy (%%): %s\n", per_class.c_str());
    std::printf("model: %s/model.pt (one file, torch.load-compatible)\n", out_dir.c_str());
    if (differ == 0)
      std::printf("%s: all %d ranks hold the same %lld parameters, bit for bit\n",
                  strategy == "fsdp" ? "gathered from the shards" : "replicas", world, (long long)params.numel());
    else
      std::printf("replicas: %lld of %d ranks hold parameters that differ from rank 0's\n", (long long)differ, world);
    std::printf(
        "summary: %d ranks, %d epochs, %lld samples in %.1f s (%.0f samples/s); test accuracy %.2f%%, test loss %.4f; "
        "total %.1f s\n",
        world, epochs, (long long)samples_seen, train_secs, double(samples_seen) / std::max(train_secs, 1e-9),
        accuracy * 100, test_loss, std::chrono::duration<double>(Clock::now() - t_start).count());
    std::printf("parameters sha256 %s\n", fingerprint.c_str());
  }
  fabric.barrier();
  return accuracy > 0.5 && differ == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const std::exception& e) {  // a dead peer, a bad checkpoint: said once, then exit 1
    std::fprintf(stderr, "train_ddp: %s\n", e.what());
    return 1;
  }
}
