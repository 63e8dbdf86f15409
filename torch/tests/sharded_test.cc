// ShardedDataParallel (FullShard, ShardGradOp, NoShard) and GatheredParameters, in real
// multi-process runs. References are computed inside each rank: chorus DDP over the same ranks,
// and one process training on the whole global batch with plain LibTorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "torch_harness.h"

namespace chorus::test {
namespace {

const ShardingStrategy kStrategies[] = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                        ShardingStrategy::NoShard};

const char* name_of(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FullShard";
    case ShardingStrategy::ShardGradOp: return "ShardGradOp";
    case ShardingStrategy::NoShard: return "NoShard";
  }
  return "?";
}

// ---- DeepSpeed's partitioning case (tests/unit/runtime/zero/test_zero.py) -------------------

struct ThreeWeights : torch::nn::Module {
  ThreeWeights() {
    for (int i = 0; i < 3; ++i) w.push_back(register_parameter("w" + std::to_string(i + 1), torch::ones({3, 5})));
  }
  std::vector<at::Tensor> forward(const at::Tensor& x) {  // hidden activations and the output
    at::Tensor h1 = w[0] * x, h2 = w[1] * h1, y = w[2] * h2;
    return {h1, h2, y};
  }
  std::vector<at::Tensor> w;
};

TEST(Sharded, DeepSpeedPartitioningCaseExactly) {
  run_world(2, [] {
    const int r = default_group()->rank();
    auto model = std::make_shared<ThreeWeights>();
    ShardedDataParallel sdp(model);
    auto shards = sdp.parameters();
    RANK_CHECK(shards.size() == 3);
    {
      at::NoGradGuard no_grad;
      for (int i = 0; i < 3; ++i) {
        RANK_CHECK(shards[i].numel() == 8, "15 elements over 2 ranks: shards of 8, got ", shards[i].numel());
        shards[i].fill_((i + 1) * (1 + r));
        if (r == 1) shards[i][7] = 0;  // padding stays zero
      }
    }
    const at::Tensor x = torch::ones({3, 5});
    for (int iter = 0; iter < 3; ++iter) {
      auto out = sdp.forward([&] { return model->forward(x); });
      const at::Tensor h1 = torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2}, at::kFloat).view({3, 5});
      const at::Tensor h2 = torch::tensor({2, 2, 2, 2, 2, 2, 2, 2, 8, 8, 8, 8, 8, 8, 8}, at::kFloat).view({3, 5});
      const at::Tensor y = torch::tensor({6, 6, 6, 6, 6, 6, 6, 6, 48, 48, 48, 48, 48, 48, 48}, at::kFloat).view({3, 5});
      RANK_CHECK_EQUAL(out[0], h1);
      RANK_CHECK_EQUAL(out[1], h2);
      RANK_CHECK_EQUAL(out[2], y);
      at::Tensor loss = torch::l1_loss(out[2], x, torch::Reduction::None);
      loss.sum().backward();
      // Gradients of the sum over both ranks' (equal) losses, averaged: as DeepSpeed's expectations.
      const float k = float(iter + 1);
      const float want0[3] = {6, 3, 2}, want1[3] = {24, 12, 8};  // w1, w2, w3
      for (int i = 0; i < 3; ++i) {
        at::Tensor want = torch::full({8}, k * (r == 0 ? want0[i] : want1[i]));
        if (r == 1) want[7] = 0;  // the padding's gradient is zero
        RANK_CHECK_EQUAL(shards[i].grad(), want);
      }
      // No full copy is left once backward is over.
      RANK_CHECK(sdp.memory_stats().full_bytes == 0, "full parameters left after backward");
    }
  });
}

// ---- direct calls fail loudly ----------------------------------------------------------------

TEST(Sharded, CallingTheModuleOutsideForwardIsAnErrorNamingTheParameter) {
  for_worlds({1, 2}, [] {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2));
    ShardedDataParallel sdp(model);
    const at::Tensor x = torch::ones({2, 4});
    std::string what = RANK_EXPECT_THROW(InvalidArgument, model->forward(x));
    RANK_CHECK(
        what.find("parameter '0.weight'") != std::string::npos || what.find("parameter '0.bias'") != std::string::npos,
        what);
    RANK_CHECK(what.find("sdp.forward") != std::string::npos, what);
    // Printing, cloning, reading values: the same error, never a shard's values.
    what = RANK_EXPECT_THROW(InvalidArgument, (void)model->parameters()[0].clone());
    what = RANK_EXPECT_THROW(InvalidArgument, (void)model->parameters()[0].sum().item<float>());
    // Through forward it works, and afterwards the direct call fails again.
    at::Tensor y = sdp.forward([&] { return model->forward(x); });
    RANK_CHECK(y.sizes() == at::IntArrayRef({2, 2}));
    RANK_EXPECT_THROW(InvalidArgument, model->forward(x));
    // Metadata stays readable.
    RANK_CHECK(model->parameters()[0].sizes() == at::IntArrayRef({3, 4}));
  });
}

// ---- training parity -------------------------------------------------------------------------

torch::nn::Sequential make_mlp(int in, int hidden, int out) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

std::pair<at::Tensor, at::Tensor> global_batch(int step, int w, int b, int in, int out) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  return {at::randn({w * b, in}, gen), at::randn({w * b, out}, gen)};
}

// 10 Adam steps of the sharded module next to chorus DDP and one process on the global batch.
void parity(ShardingStrategy strategy, bool units, int in, int hidden, int out) {
  const int w = default_group()->size(), me = default_group()->rank(), b = 4, steps = 10;
  auto model = make_mlp(in, hidden, out), ddp_model = make_mlp(in, hidden, out), ref = make_mlp(in, hidden, out);
  ShardedOptions options{.strategy = strategy};
  if (units) options.units = {model->ptr(0), model->ptr(2)};
  ShardedDataParallel sdp(model.ptr(), options);
  DistributedDataParallel ddp(ddp_model.ptr());
  torch::optim::Adam opt(sdp.parameters(), 1e-2), ddp_opt(ddp_model->parameters(), 1e-2),
      ref_opt(ref->parameters(), 1e-2);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, w, b, in, out);
    at::Tensor mine = x.narrow(0, me * b, b), target = y.narrow(0, me * b, b);
    opt.zero_grad();
    at::Tensor loss = sdp.forward([&] { return torch::mse_loss(model->forward(mine), target); });
    loss.backward();
    opt.step();
    ddp_opt.zero_grad();
    at::Tensor ddp_loss = torch::mse_loss(ddp_model->forward(mine), target);
    ddp_loss.backward();
    ddp_opt.step();
    ref_opt.zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt.step();
    RANK_CHECK(std::abs(loss.item<double>() - ddp_loss.item<double>()) <= 1e-5, name_of(strategy), " step ", step,
               ": loss ", loss.item<double>(), " vs DDP ", ddp_loss.item<double>());
  }
  auto full = sdp.full_state_dict();
  // Compare on every rank: broadcast rank 0's gathered values.
  auto ref_params = ref->named_parameters();
  auto ddp_params = ddp_model->named_parameters();
  for (const auto& item : ref_params) {
    at::Tensor t = me == 0 ? full[item.key()] : at::empty_like(item.value());
    default_group()->broadcast_(t, 0);
    const double d_ref = (t - item.value()).abs().max().item<double>();
    const double d_ddp = (t - ddp_params[item.key()]).abs().max().item<double>();
    RANK_CHECK(d_ref <= 1e-5 && d_ddp <= 1e-5, name_of(strategy), units ? " units " : " whole ", item.key(),
               ": differs from one process by ", d_ref, " and from DDP by ", d_ddp);
  }
  // The gathered full parameters are bitwise the same on every rank.
  GatheredParameters gathered({model.ptr()});
  for (const auto& p : model->parameters()) {
    at::Tensor all = default_group()->all_gather(p.detach().clone());
    for (int r = 1; r < w; ++r) RANK_CHECK(at::equal(all[r], all[0]), "gathered parameters differ between ranks");
  }
  gathered.exit();
}

TEST(Sharded, TrainingMatchesDDPAndOneProcessEvenAndUneven) {
  for_worlds({1, 2, 3, 4}, [] {
    for (ShardingStrategy s : kStrategies)
      for (bool units : {false, true}) {
        parity(s, units, 16, 15, 8);
        parity(s, units, 7, 15, 3);
      }
  });
}

}  // namespace
}  // namespace chorus::test
