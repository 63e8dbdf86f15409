// DistributedDataParallel, no_backward_sync and the comm hooks, in real multi-process runs.
// References are computed inside each rank with plain LibTorch (no chorus): one process training
// on the whole global batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                               torch::nn::ReLU(), torch::nn::Linear(16, 4));
}

torch::nn::Sequential make_convnet() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::ReLU(),
                               torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 3));
}

// The global batch of a step: (W * B, ...) inputs and targets, the same on every rank.
std::pair<at::Tensor, at::Tensor> global_batch(int step, int w, int b, bool conv) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  at::Tensor x = conv ? at::randn({w * b, 1, 8, 8}, gen) : at::randn({w * b, 8}, gen);
  at::Tensor y = at::randn({w * b, conv ? 3 : 4}, gen);
  return {x, y};
}

double max_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double d = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) d = std::max(d, (pa[i] - pb[i]).abs().max().item<double>());
  return d;
}

// Every rank's parameters, bitwise equal.
void check_identical_across_ranks(torch::nn::Module& m) {
  auto g = default_group();
  for (const auto& p : m.parameters()) {
    at::Tensor all = g->all_gather(p.detach());
    for (int r = 1; r < g->size(); ++r) RANK_CHECK(at::equal(all[r], all[0]), "parameters differ between ranks");
  }
}

// `steps` SGD steps of `model` (under DDP, this rank's B rows of each global batch) next to
// `reference` trained alone on the whole global batch.
void train_side_by_side(torch::nn::Sequential& model, torch::nn::Sequential& reference, int steps, bool conv) {
  const int w = default_group()->size(), me = default_group()->rank(), b = 4;
  torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, w, b, conv);
    opt.zero_grad();
    torch::mse_loss(model->forward(x.narrow(0, me * b, b)), y.narrow(0, me * b, b)).backward();
    opt.step();
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
}

void train_matches_one_process(bool conv) {
  auto model = conv ? make_convnet() : make_mlp();
  auto reference = conv ? make_convnet() : make_mlp();
  DistributedDataParallel ddp(model.ptr());
  train_side_by_side(model, reference, 10, conv);
  const double d = max_diff(*model, *reference);
  RANK_CHECK(d <= 1e-5, "DDP drifted from one process with the whole batch by ", d);
  check_identical_across_ranks(*model);
}

TEST(DDP, MlpMatchesOneProcessWithTheWholeBatch) {
  for_worlds({1, 2, 3}, [] { train_matches_one_process(false); });
}

TEST(DDP, ConvNetMatchesOneProcessWithTheWholeBatch) {
  for_worlds({2, 3}, [] { train_matches_one_process(true); });
}

TEST(DDP, SmallBucketsOverlapAndStillMatch) {
  for_worlds({2}, [] {
    auto model = make_mlp();
    auto reference = make_mlp();
    // Tiny buckets: one per parameter or so, launched while backward is still running.
    DistributedDataParallel ddp(model.ptr(), {.bucket_cap_mb = 1e-5, .first_bucket_mb = 1e-5});
    RANK_CHECK(ddp.bucket_layout().size() == 6, "expected a bucket per parameter, got ", ddp.bucket_layout().size());
    RANK_CHECK(ddp.bucket_layout().front().front() == model->parameters().size() - 1,
               "buckets start from the last parameter");
    train_side_by_side(model, reference, 5, false);
    RANK_CHECK(max_diff(*model, *reference) <= 1e-5);
  });
}

TEST(DDP, NoBackwardSyncAccumulatesThenSyncsOnce) {
  for_worlds({2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank(), b = 2, k = 3;
    Fabric fabric;
    auto model = make_mlp();
    auto reference = make_mlp();
    auto& ddp = fabric.setup(model);
    torch::optim::SGD opt(model->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      // Micro-batch j of rank r is rows [(j * w + r) * b, +b) of the global batch.
      auto [x, y] = global_batch(step, w * k, b, false);
      opt.zero_grad();
      for (int j = 0; j < k; ++j) {
        auto guard = fabric.no_backward_sync(ddp, /*enabled=*/j < k - 1);
        const int64_t at = (j * w + me) * b;
        (torch::mse_loss(model->forward(x.narrow(0, at, b)), y.narrow(0, at, b)) / k).backward();
      }
      opt.step();
      ref_opt.zero_grad();
      torch::mse_loss(reference->forward(x), y).backward();
      ref_opt.step();
    }
    RANK_CHECK(max_diff(*model, *reference) <= 1e-5, max_diff(*model, *reference));
    check_identical_across_ranks(*model);
    auto other = make_mlp();
    RANK_EXPECT_THROW(InvalidArgument, fabric.no_backward_sync(*other));
    DistributedDataParallel stranger(make_mlp().ptr());
    auto msg = RANK_EXPECT_THROW(InvalidArgument, fabric.no_backward_sync(stranger));
    RANK_CHECK(msg.find("fabric.setup") != std::string::npos, msg);
  });
}

// Gradients of one backward of a fresh MLP on rank-dependent data, with an optional hook.
std::vector<at::Tensor> grads_with(const std::function<void(DistributedDataParallel&)>& setup_hook) {
  const int me = default_group()->rank();
  auto model = make_mlp();
  DistributedDataParallel ddp(model.ptr());
  if (setup_hook) setup_hook(ddp);
  auto [x, y] = global_batch(0, default_group()->size(), 4, false);
  torch::mse_loss(model->forward(x.narrow(0, me * 4, 4)), y.narrow(0, me * 4, 4)).backward();
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

double relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]).pow(2).sum().item<double>();
    den += b[i].pow(2).sum().item<double>();
  }
  return std::sqrt(num / den);
}

TEST(CommHooks, AllreduceCompressionAndFullRankPowerSGD) {
  for_worlds({2, 3}, [] {
    auto plain = grads_with(nullptr);
    auto hooked = grads_with([](DistributedDataParallel& d) { d.register_comm_hook(allreduce_hook()); });
    for (size_t i = 0; i < plain.size(); ++i) RANK_CHECK(at::equal(plain[i], hooked[i]), "allreduce hook differs");
    const double fp16 = relative(grads_with([](auto& d) { d.register_comm_hook(fp16_compress_hook()); }), plain);
    RANK_CHECK(fp16 <= 1e-3, "fp16 compression off by ", fp16);
    const double bf16 = relative(grads_with([](auto& d) { d.register_comm_hook(bf16_compress_hook()); }), plain);
    // bf16 keeps 8 significant bits: each of the two roundings (the inputs, the sum) is off by at
    // most 2^-9 relative, so 1e-3 cannot be met; 2^-8 bounds both together.
    RANK_CHECK(bf16 <= 0x1p-8 && bf16 > 0, "bf16 compression off by ", bf16);
    const double wrapped =
        relative(grads_with([](auto& d) { d.register_comm_hook(fp16_compress_wrapper(allreduce_hook())); }), plain);
    RANK_CHECK(wrapped <= 1e-3, "fp16 wrapper off by ", wrapped);
    const double bwrapped =
        relative(grads_with([](auto& d) { d.register_comm_hook(bf16_compress_wrapper(allreduce_hook())); }), plain);
    RANK_CHECK(bwrapped <= 0x1p-8, "bf16 wrapper off by ", bwrapped);

    // PowerSGD with the full rank (every matrix compressed) reproduces allreduce.
    auto state = std::make_shared<PowerSGDState>();
    state->matrix_approximation_rank = 16;
    state->start_powerSGD_iter = 0;
    state->min_compression_rate = 0;
    const double full = relative(grads_with([&](auto& d) { d.register_comm_hook(powerSGD_hook(state)); }), plain);
    RANK_CHECK(full <= 1e-4, "full-rank PowerSGD off by ", full);
    RANK_CHECK(!state->q.empty(), "PowerSGD compressed nothing");
    // Lightning's form, with a wrapper.
    auto lstate = std::make_shared<PowerSGDState>(*state);
    lstate->q.clear();
    const double lightning = relative(grads_with([&](auto& d) {
                                        register_ddp_comm_hook<PowerSGDState>(
                                            d, lstate,
                                            [](PowerSGDState& s, GradBucket& b) {
                                              return powerSGD_hook(std::shared_ptr<PowerSGDState>(&s, [](auto*) {}))(b);
                                            },
                                            fp16_compress_wrapper);
                                      }),
                                      plain);
    RANK_CHECK(lightning <= 2e-3, "register_ddp_comm_hook(powerSGD, fp16 wrapper) off by ", lightning);
  });
}

// Held-out loss after 300 SGD steps on a synthetic regression (a linear truth plus noise of
// variance 0.25, the floor any model can reach), with the given hook.
double regression_loss(const std::function<void(DistributedDataParallel&)>& setup_hook) {
  const int w = default_group()->size(), me = default_group()->rank(), b = 16;
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
  DistributedDataParallel ddp(model.ptr());
  if (setup_hook) setup_hook(ddp);
  auto gen = at::detail::createCPUGenerator(7);
  at::Tensor truth = at::randn({32, 8}, gen) / 4;
  auto sample = [&](uint64_t seed, int64_t rows) {
    auto g = at::detail::createCPUGenerator(seed);
    at::Tensor x = at::randn({rows, 32}, g);
    return std::make_pair(x, at::mm(x, truth) + 0.5 * at::randn({rows, 8}, g));
  };
  torch::optim::SGD opt(model->parameters(), 0.05);
  for (int step = 0; step < 300; ++step) {
    auto [x, y] = sample(100 + step, w * b);
    opt.zero_grad();
    torch::mse_loss(model->forward(x.narrow(0, me * b, b)), y.narrow(0, me * b, b)).backward();
    opt.step();
  }
  auto [x, y] = sample(1, 4096);
  torch::NoGradGuard no_grad;
  return torch::mse_loss(model->forward(x), y).item<double>();
}

TEST(CommHooks, LowRankPowerSGDTrainsAlmostAsWellAsDDP) {
  for_worlds({2}, [] {
    const double plain = regression_loss(nullptr);
    for (int rank : {1, 2, 4}) {
      for (bool batched : {false, true}) {
        auto state = std::make_shared<PowerSGDState>();
        state->matrix_approximation_rank = rank;
        state->start_powerSGD_iter = 10;
        const double loss = regression_loss(
            [&](auto& d) { d.register_comm_hook(batched ? batched_powerSGD_hook(state) : powerSGD_hook(state)); });
        RANK_CHECK(loss <= 1.05 * plain, "PowerSGD rank ", rank, batched ? " (batched)" : "", ": loss ", loss,
                   " against DDP's ", plain);
      }
    }
  });
}

TEST(CommHooks, PowerSGDStatesAreCheckedWhenTheHookIsMade) {
  for (auto make : {powerSGD_hook, batched_powerSGD_hook}) {
    EXPECT_THROW(make(nullptr), InvalidArgument);
    auto state = std::make_shared<PowerSGDState>();
    state->matrix_approximation_rank = 0;
    try {
      make(state);
      ADD_FAILURE() << "a rank of 0 was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("matrix_approximation_rank must be >= 1 (it is 0)"), std::string::npos)
          << e.what();
    }
  }
}

TEST(CommHooks, PostLocalSGDSwitchesToTheSubgroupAndTheAveragerReequalizes) {
  for_worlds({4}, [] {
    const int me = default_group()->rank();
    auto low = new_group({0, 1});
    auto high = new_group({2, 3});
    auto state = std::make_shared<PostLocalSGDState>();
    state->subgroup = me < 2 ? low : high;
    state->start_localSGD_iter = 3;
    auto model = make_mlp();
    DistributedDataParallel ddp(model.ptr());
    ddp.register_comm_hook(post_localSGD_hook(state));
    torch::optim::SGD opt(model->parameters(), 0.1);
    PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/3);
    auto params_of = [&] {
      std::vector<at::Tensor> out;
      for (const auto& p : model->parameters()) out.push_back(p.detach().reshape({-1}));
      return default_group()->all_gather(at::cat(out));  // (4, n)
    };
    for (int step = 0; step < 6; ++step) {
      auto [x, y] = global_batch(step, 4, 4, false);
      opt.zero_grad();
      torch::mse_loss(model->forward(x.narrow(0, me * 4, 4)), y.narrow(0, me * 4, 4)).backward();
      opt.step();
      at::Tensor all = params_of();
      if (step < 3) {
        RANK_CHECK(at::equal(all[0], all[3]), "step ", step, ": global all-reduce expected");
      } else {
        RANK_CHECK(at::equal(all[0], all[1]) && at::equal(all[2], all[3]), "step ", step,
                   ": subgroups diverged inside");
        RANK_CHECK(!at::equal(all[0], all[2]), "step ", step, ": subgroups should differ after local SGD started");
      }
      averager.average_parameters(model->parameters());
      at::Tensor after = params_of();
      if (step == 3) RANK_CHECK(at::allclose(after[0], after[2], 0, 1e-6), "the averager should re-equalize at step 3");
    }
    RANK_CHECK(state->iter == 6);
  });
}

TEST(DDP, UnusedParametersAreNamedOrHandled) {
  struct TwoHeads : torch::nn::Module {
    TwoHeads() {
      torch::manual_seed(0);
      a = register_module("a", torch::nn::Linear(4, 2));
      b = register_module("b", torch::nn::Linear(4, 2));
    }
    at::Tensor forward(const at::Tensor& x, bool use_b) { return use_b ? a(x) + b(x) : a(x); }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  for_worlds({2}, [] {
    const int me = default_group()->rank();
    auto strict = std::make_shared<TwoHeads>();
    DistributedDataParallel ddp(strict);
    auto msg = RANK_EXPECT_THROW(InvalidArgument, strict->forward(at::ones({3, 4}), false).sum().backward());
    RANK_CHECK(msg.find("b.weight") != std::string::npos && msg.find("find_unused_parameters") != std::string::npos,
               msg);
    strict->forward(at::ones({3, 4}), true).sum().backward();  // the group is still usable

    auto lenient = std::make_shared<TwoHeads>();
    DistributedDataParallel ddp2(lenient, {.find_unused_parameters = true});
    // Rank 1 uses head b, rank 0 does not: b's gradient is rank 1's, averaged.
    lenient->forward(at::ones({3, 4}), me == 1).sum().backward();
    RANK_CHECK_EQUAL(lenient->b->weight.grad(), at::full({2, 4}, 1.5f));
    RANK_CHECK_EQUAL(lenient->a->weight.grad(), at::full({2, 4}, 3.0f));
  });
}

TEST(DDP, HooksMustComeFirstAndBuffersFollowRankZero) {
  for_worlds({2}, [] {
    const int me = default_group()->rank();
    torch::manual_seed(me);  // different on purpose: DDP starts everyone from rank 0's
    torch::nn::Sequential model(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
    DistributedDataParallel ddp(model.ptr());
    check_identical_across_ranks(*model);
    model->forward(at::randn({5, 3}) + me).sum().backward();
    auto buffers = model->buffers();
    at::Tensor all = default_group()->all_gather(buffers[0]);
    RANK_CHECK(at::equal(all[0], all[1]), "running statistics should follow rank 0's after backward");
    RANK_EXPECT_THROW(InvalidArgument, ddp.register_comm_hook(allreduce_hook()));
  });
}

}  // namespace
}  // namespace chorus::test
