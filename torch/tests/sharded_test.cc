// ShardedDataParallel (FullShard, ShardGradOp, NoShard) and GatheredParameters, in real
// multi-process runs. References are computed inside each rank: chorus DDP over the same ranks,
// and one process training on the whole global batch with plain LibTorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

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
    for (const char* name : {"w1", "w2", "w3"}) w.push_back(register_parameter(name, torch::ones({3, 5})));
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

// ---- GatheredParameters ----------------------------------------------------------------------

struct TwoLinears : torch::nn::Module {
  TwoLinears() {
    torch::manual_seed(0);
    l1 = register_module("l1", torch::nn::Linear(10, 10));
    l2 = register_module("l2", torch::nn::Linear(10, 10));
  }
  at::Tensor forward(const at::Tensor& x) { return l2->forward(l1->forward(x)); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};

// Rank 0's initial values, made the same way as TwoLinears.
at::Tensor initial_l1_weight() {
  torch::manual_seed(0);
  return torch::nn::Linear(10, 10)->weight.detach().clone();
}

TEST(GatheredParameters, FullValuesInsideNothingFullOutside) {
  for_worlds({1, 2, 3, 4}, [] {
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    {
      GatheredParameters gathered({std::static_pointer_cast<torch::nn::Module>(model)});
      RANK_CHECK(model->l1->weight.numel() == 100);
      RANK_CHECK_EQUAL(model->l1->weight.detach().clone(), initial_l1_weight());
      const int64_t w = default_group()->size();
      auto padded = [&](int64_t n) { return w * ((n + w - 1) / w); };
      RANK_CHECK(sdp.memory_stats().full_bytes == 4 * (padded(100) + padded(10) + padded(100) + padded(10)));
      // Gathered into the group's symmetric memory (Note [Sharded buffers in symmetric memory]).
      for (const auto& p : model->parameters())
        RANK_CHECK(in_shared_memory(p.data_ptr()) == (w > 1), "a full parameter in ", w > 1 ? "ordinary" : "symmetric",
                   " memory");
    }
    RANK_CHECK(sdp.memory_stats().full_bytes == 0, "a full copy outlived GatheredParameters");
    RANK_EXPECT_THROW(InvalidArgument, (void)model->l1->weight.clone());
    // Tensors, duplicates and another order: the same gathering.
    GatheredParameters again({model->l2->weight, model->l1->weight, model->l2->weight});
    RANK_CHECK(model->l2->weight.sum().item<float>() == model->l2->weight.sum().item<float>());
    again.exit();
    again.exit();  // once
  });
}

TEST(GatheredParameters, ModifierRanksValuesBecomeEveryonesAndAreResharded) {
  for_worlds({2, 3}, [] {
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    const int me = default_group()->rank();
    {
      GatheredParameters g({model->l1->weight}, /*modifier_rank=*/1);
      at::NoGradGuard no_grad;
      if (me == 1)
        model->l1->weight.zero_();
      else
        model->l1->weight.fill_(7);  // not the modifier: dropped
    }
    GatheredParameters g({model->l1->weight});
    RANK_CHECK_EQUAL(model->l1->weight.detach().clone(), torch::zeros({10, 10}));
    g.exit();
    // And training sees it: the shards changed too.
    for (const auto& item : sdp.named_parameters())
      if (item.key() == "l1.weight") RANK_CHECK(item.value().abs().sum().item<float>() == 0);
  });
}

TEST(GatheredParameters, AnEditWithoutAModifierIsAnErrorOnEveryRank) {
  for_worlds({1, 2}, [] {
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    const int me = default_group()->rank(), w = default_group()->size();
    const at::Tensor before = sdp.parameters()[0].detach().clone();
    std::string what = RANK_EXPECT_THROW(InvalidArgument, {
      GatheredParameters g({model->l1->weight, model->l2->weight});
      at::NoGradGuard no_grad;
      if (me == w - 1) model->l1->weight.add_(0.0);  // even a no-op edit counts
      g.exit();
    });
    RANK_CHECK(what.find("'l1.weight' (on rank " + std::to_string(w - 1) + ")") != std::string::npos, what);
    RANK_CHECK(what.find("l2.weight") == std::string::npos, what);
    RANK_CHECK_EQUAL(sdp.parameters()[0].detach().clone(), before);
    RANK_CHECK(sdp.memory_stats().full_bytes == 0);
    // The destructor does not throw: the next forward does.
    {
      GatheredParameters g({model->l1->weight});
      at::NoGradGuard no_grad;
      model->l1->weight.mul_(2);
    }
    what = RANK_EXPECT_THROW(InvalidArgument, sdp.forward([&] { return model->forward(torch::ones({1, 10})); }));
    RANK_CHECK(what.find("l1.weight") != std::string::npos, what);
    sdp.forward([&] { return model->forward(torch::ones({1, 10})); });  // thrown once
  });
}

TEST(GatheredParameters, DisjointNestingWorksOverlapIsRejectedBeforeAnyCollective) {
  for_worlds({2}, [] {
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    GatheredParameters outer({model->l1->weight, model->l1->bias});
    {
      GatheredParameters inner({model->l2->weight});
      RANK_CHECK(model->l2->weight.sum().item<float>() == model->l2->weight.sum().item<float>());
    }
    RANK_CHECK(model->l1->weight.numel() == 100 && model->l1->weight.sum().item<float>() != 0);
    // Overlap: rejected on this rank alone (only rank 0 tries: no collective may be involved).
    if (default_group()->rank() == 0) {
      std::string what = RANK_EXPECT_THROW(InvalidArgument, GatheredParameters({model->l1->bias, model->l2->bias}));
      RANK_CHECK(what.find("'l1.bias'") != std::string::npos && what.find("l2.bias") == std::string::npos, what);
      RANK_EXPECT_THROW(InvalidArgument, (void)model->l2->bias.clone());  // l2.bias was not gathered
    }
    (void)model->l1->weight.clone();  // outer intact
    outer.exit();
    RANK_CHECK(sdp.memory_stats().full_bytes == 0);
  });
}

TEST(GatheredParameters, DifferentListsAreAMismatchShowingEachRanksList) {
  for_worlds({2, 3}, [] {
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    const int me = default_group()->rank();
    std::vector<at::Tensor> mine = {model->l1->weight};
    if (me == 1) mine.push_back(model->l2->bias);
    std::string what = RANK_EXPECT_THROW(CollectiveMismatch, GatheredParameters g(mine));
    RANK_CHECK(what.find("rank 0: [l1.weight]") != std::string::npos, what);
    RANK_CHECK(what.find("rank 1: [l1.weight, l2.bias]") != std::string::npos, what);
    RANK_CHECK(sdp.memory_stats().full_bytes == 0);
  });
}

TEST(GatheredParameters, ARankThatNeverEntersIsNamedAtTheDeadline) {
  run_world(
      3,
      [] {
        auto model = std::make_shared<TwoLinears>();
        ShardedDataParallel sdp(model);
        if (default_group()->rank() == 2) {  // alive, but never enters
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        try {
          GatheredParameters g({model->l1->weight});
          throw std::runtime_error("GatheredParameters did not time out");
        } catch (const TimeoutError& e) {
          RANK_CHECK(e.missing_ranks() == std::vector<int>{2}, e.what());
        }
      },
      std::chrono::seconds(2));
}

TEST(GatheredParameters, NoOpsWithoutShardsAndDisabledAndDuringForwardIsAnError) {
  for_worlds({1, 2}, [] {
    const int me = default_group()->rank();
    // A plain module: a no-op, values as they are.
    auto plain = std::make_shared<TwoLinears>();
    {
      GatheredParameters g({std::static_pointer_cast<torch::nn::Module>(plain)}, 0);
      RANK_CHECK_EQUAL(plain->l1->weight.detach().clone(), initial_l1_weight());
    }
    // enabled = false: nothing, no communication (only rank 0 makes one).
    auto model = std::make_shared<TwoLinears>();
    ShardedDataParallel sdp(model);
    if (me == 0) GatheredParameters({model->l1->weight}, std::nullopt, /*enabled=*/false).exit();
    RANK_EXPECT_THROW(InvalidArgument, (void)model->l1->weight.clone());
    // During forward: rejected.
    std::string what = RANK_EXPECT_THROW(InvalidArgument, sdp.forward([&] {
      GatheredParameters g({model->l1->weight});
      return 0;
    }));
    RANK_CHECK(what.find("during") != std::string::npos, what);
    // DDP: the modifier's values are broadcast on exit, so replicas stay equal.
    auto replicated = std::make_shared<TwoLinears>();
    DistributedDataParallel ddp(replicated);
    {
      GatheredParameters g({replicated->l1->weight}, 0);
      at::NoGradGuard no_grad;
      replicated->l1->weight.fill_(float(me + 1));
    }
    RANK_CHECK_EQUAL(replicated->l1->weight.detach().clone(), torch::ones({10, 10}));
  });
}

// ---- no_sync and memory ------------------------------------------------------------------------

TEST(Sharded, NoSyncAccumulatesLocallyThenReducesTheSum) {
  for_worlds({2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank(), b = 2, k = 3;
    for (ShardingStrategy s : kStrategies) {
      auto model = make_mlp(8, 12, 4), ref = make_mlp(8, 12, 4);
      ShardedDataParallel sdp(model.ptr(), {.strategy = s});
      torch::optim::SGD opt(sdp.parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
      for (int micro = 0; micro < k; ++micro) {
        auto [x, y] = global_batch(micro, w, b, 8, 4);
        auto guard = micro + 1 < k ? sdp.no_sync() : NoSyncGuard(static_cast<ShardedDataParallel*>(nullptr));
        sdp.forward([&] { return torch::mse_loss(model->forward(x.narrow(0, me * b, b)), y.narrow(0, me * b, b)); })
            .backward();
        torch::mse_loss(ref->forward(x), y).backward();
        if (micro + 1 < k && s != ShardingStrategy::NoShard)
          RANK_CHECK(!sdp.parameters()[0].grad().defined(), "no_sync reduced something");
      }
      opt.step();
      ref_opt.step();
      auto full = sdp.full_state_dict();
      for (const auto& item : ref->named_parameters()) {
        at::Tensor t = me == 0 ? full[item.key()] : at::empty_like(item.value());
        default_group()->broadcast_(t, 0);
        RANK_CHECK((t - item.value()).abs().max().item<double>() <= 1e-5, name_of(s), " ", item.key());
      }
    }
  });
}

// Model-state bytes actually held per rank (shards, their gradients, Adam's state), against 16 Psi / W.
TEST(Sharded, FullShardHoldsSixteenBytesPerParameterOverW) {
  for_worlds({1, 2, 4}, [] {
    const int w = default_group()->size();
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int i = 0; i < 6; ++i) model->push_back(torch::nn::Linear(128, 128));
    int64_t psi = 0, largest = 0;
    for (const auto& child : model->children()) {
      int64_t n = 0;
      for (const auto& p : child->parameters()) n += p.numel();
      largest = std::max(largest, n);
    }
    for (const auto& p : model->parameters()) psi += p.numel();
    ShardedDataParallel sdp(model.ptr(), {.units = units_of_size(model.ptr(), 1)});
    RANK_CHECK(sdp.unit_layout().size() == 7, "root + 6 Linear units, got ", sdp.unit_layout().size());
    torch::optim::Adam opt(sdp.parameters(), 1e-3);
    sdp.reset_peak_memory();
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      sdp.forward([&] { return model->forward(torch::ones({4, 128})).sum(); }).backward();
      opt.step();
    }
    int64_t optimizer_bytes = 0;
    for (const auto& p : sdp.parameters()) {
      auto& state = static_cast<torch::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
      optimizer_bytes += (state.exp_avg().numel() + state.exp_avg_sq().numel()) * 4;
    }
    auto m = sdp.memory_stats();
    const int64_t held = m.shard_bytes + m.shard_grad_bytes + optimizer_bytes;
    const int64_t padding = 12 * w * 16;  // < W padding elements per tensor, 16 bytes each
    RANK_CHECK(held <= 16 * psi / w + padding && held >= 16 * psi / w, "held ", held,
               " bytes, 16 Psi / W = ", 16 * psi / w);
    RANK_CHECK(m.full_bytes == 0 && m.full_grad_bytes == 0, "full copies left after the step");
    // Transients: full parameters of the current and the prefetched unit, the current unit's full
    // gradients and its reduction buffer: at most 4 units' worth (plus padding), never the whole
    // model's parameters and gradients.
    RANK_CHECK(m.peak_transient_bytes <= 4 * 4 * largest + padding, "peak transient ", m.peak_transient_bytes,
               " bytes, largest unit ", 4 * largest);
    RANK_CHECK(m.peak_transient_bytes < 8 * psi, "the peak held the whole model at once: ", m.peak_transient_bytes);
  });
}

// Fabric(strategy = "fsdp"): setup_module shards, no_backward_sync accumulates; under "ddp" the
// same loop keeps replicas. Either way it matches one process on the global batch.
TEST(Sharded, FabricFsdpAndDdpRunTheSameLoop) {
  for_worlds({2, 3}, [] {
    const int w = default_group()->size(), me = default_group()->rank(), b = 2, k = 2;
    for (const char* strategy : {"fsdp", "ddp"}) {
      Fabric fabric({.strategy = strategy});
      auto model = make_mlp(8, 12, 4), ref = make_mlp(8, 12, 4);
      auto& sharded = fabric.setup_module(model);
      RANK_CHECK((sharded.strategy() == ShardingStrategy::FullShard) == (std::string(strategy) == "fsdp"));
      if (std::string(strategy) == "fsdp") {
        std::string what = RANK_EXPECT_THROW(InvalidArgument, fabric.setup(make_mlp(8, 12, 4).ptr()));
        RANK_CHECK(what.find("setup_module") != std::string::npos, what);
      }
      RANK_EXPECT_THROW(InvalidArgument, fabric.setup_module(model));  // twice
      torch::optim::Adam opt(sharded.parameters(), 1e-2), ref_opt(ref->parameters(), 1e-2);
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = global_batch(step, w * k, b, 8, 4);
        opt.zero_grad();
        for (int j = 0; j < k; ++j) {
          auto guard = fabric.no_backward_sync(sharded, /*enabled=*/j < k - 1);
          const int64_t at = (j * w + me) * b;
          sharded.forward([&] { return torch::mse_loss(model->forward(x.narrow(0, at, b)), y.narrow(0, at, b)) / k; })
              .backward();
        }
        opt.step();
        ref_opt.zero_grad();
        torch::mse_loss(ref->forward(x), y).backward();
        ref_opt.step();
      }
      auto full = sharded.full_state_dict();
      for (const auto& item : ref->named_parameters()) {
        at::Tensor t = me == 0 ? full[item.key()] : at::empty_like(item.value());
        default_group()->broadcast_(t, 0);
        RANK_CHECK((t - item.value()).abs().max().item<double>() <= 1e-5, strategy, " ", item.key());
      }
      auto guard = fabric.no_backward_sync(*model);  // by the module, too
    }
  });
}

TEST(Sharded, BadSetupsAreNamed) {
  for_worlds({1, 2}, [] {
    RANK_EXPECT_THROW(InvalidArgument, ShardedDataParallel(std::shared_ptr<torch::nn::Module>()));
    auto model = make_mlp(4, 4, 2), other = make_mlp(4, 4, 2);
    std::string what = RANK_EXPECT_THROW(InvalidArgument, ShardedDataParallel(model.ptr(), {.units = {other->ptr(0)}}));
    RANK_CHECK(what.find("not a submodule") != std::string::npos, what);
    ShardedDataParallel sdp(model.ptr());
    // forward inside forward, and backward state: named.
    what = RANK_EXPECT_THROW(InvalidArgument, sdp.forward([&] { return sdp.forward([&] { return 1; }); }));
    RANK_CHECK(what.find("already inside forward") != std::string::npos, what);
    // An exception inside fn ends the forward: the module is usable again, with no full copy left.
    RANK_EXPECT_THROW(std::runtime_error, sdp.forward([&]() -> int {
      (void)model->forward(torch::ones({1, 4}));
      throw std::runtime_error("user error");
    }));
    RANK_CHECK(sdp.memory_stats().full_bytes == 0);
    at::Tensor y = sdp.forward([&] { return model->forward(torch::ones({1, 4})); });
    RANK_CHECK(y.sizes() == at::IntArrayRef({1, 2}));
    // Without grad: nothing kept for a backward.
    {
      at::NoGradGuard no_grad;
      sdp.forward([&] { return model->forward(torch::ones({1, 4})); });
    }
    RANK_CHECK(sdp.memory_stats().full_bytes == 0);
  });
}

// DeepSpeed's TestZero3InitForParentWeightInitialization: every rank initializes differently;
// rank 0's values win. And what each strategy keeps between forward and backward.
TEST(Sharded, RankZerosValuesWinAndStrategiesKeepWhatTheySay) {
  for_worlds({2, 4}, [] {
    const int me = default_group()->rank(), w = default_group()->size();
    for (ShardingStrategy s : kStrategies) {
      torch::nn::Linear model(12, 1);
      {
        at::NoGradGuard no_grad;
        model->weight.fill_(1 + me);
        model->bias.fill_(10 + me);
      }
      ShardedDataParallel sdp(model, {.strategy = s});
      if (s != ShardingStrategy::NoShard) {
        RANK_CHECK(sdp.parameters()[0].numel() == (12 + w - 1) / w);
        RANK_CHECK(sdp.parameters()[0].detach().eq(1).all().item<bool>(), "shard of rank ", me, " is not rank 0's");
      }
      {
        GatheredParameters g({std::static_pointer_cast<torch::nn::Module>(model.ptr())});
        RANK_CHECK(model->weight.detach().eq(1).all().item<bool>() && model->bias.detach().eq(10).all().item<bool>());
      }
      at::Tensor out = sdp.forward([&] { return model->forward(torch::ones({2, 12})).sum(); });
      const int64_t between = sdp.memory_stats().full_bytes;
      if (s == ShardingStrategy::FullShard) RANK_CHECK(between == 0, "FullShard kept full parameters after forward");
      if (s == ShardingStrategy::ShardGradOp)
        RANK_CHECK(between > 0, "ShardGradOp freed its parameters before backward");
      out.backward();
      RANK_CHECK(sdp.memory_stats().full_bytes == 0 || s == ShardingStrategy::NoShard);
    }
  });
}

// 3 SGD steps of `sdp` (over `model`, a module with one weight `w`) beside `ref` trained in one
// process on the global batch. Checks on every rank that the full parameter `name` equals ref.w;
// returns full_state_dict() (rank 0's holds the values).
template <class M>
torch::OrderedDict<std::string, at::Tensor> train_beside_one_process(ShardedDataParallel& sdp, M& model, M& ref, int in,
                                                                     int out, const std::string& name) {
  const int w = default_group()->size(), me = default_group()->rank(), b = 2;
  const at::Tensor& ref_w = ref.w;
  torch::optim::SGD opt(sdp.parameters(), 0.1);
  torch::optim::SGD ref_opt(std::vector<at::Tensor>{ref_w}, 0.1);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step, w, b, in, out);
    opt.zero_grad();
    sdp.forward([&] { return torch::mse_loss(model.forward(x.narrow(0, me * b, b)), y.narrow(0, me * b, b)); })
        .backward();
    opt.step();
    ref_opt.zero_grad();
    torch::mse_loss(ref.forward(x), y).backward();
    ref_opt.step();
  }
  auto full = sdp.full_state_dict();
  at::Tensor t = me == 0 ? full[name] : at::empty(ref_w.sizes());
  default_group()->broadcast_(t, 0);
  RANK_CHECK((t - ref_w).abs().max().item<double>() <= 1e-5, "'", name, "' trained apart from one process: ", t, ref_w);
  return full;
}

struct Tied : torch::nn::Module {
  Tied() {
    torch::manual_seed(0);
    w = register_parameter("a", torch::randn({4, 4}) * 0.5);
    register_parameter("b", w);  // the same tensor under a second name
  }
  at::Tensor forward(const at::Tensor& x) { return x.mm(w).tanh().mm(w.t()); }
  at::Tensor w;
};

TEST(Sharded, TiedParametersAreShardedOnceAndAModuleOutlivingItsShardsSaysSo) {
  for_worlds({1, 2, 3}, [] {
    const int me = default_group()->rank();
    auto model = std::make_shared<Tied>(), ref = std::make_shared<Tied>();
    {
      ShardedDataParallel sdp(model);
      RANK_CHECK(sdp.parameters().size() == 1, "a tied parameter is one shard, got ", sdp.parameters().size());
      auto full = train_beside_one_process(sdp, *model, *ref, 4, 4, "a");
      if (me == 0) RANK_CHECK(full.size() == 2 && full["b"].equal(full["a"]), "both names, as the module lists them");
    }
    std::string what = RANK_EXPECT_THROW(InvalidArgument, model->forward(torch::ones({1, 4})));
    RANK_CHECK(what.find("no longer exists") != std::string::npos, what);
  });
}

struct Transposed : torch::nn::Module {
  Transposed() {
    torch::manual_seed(0);
    w = register_parameter("w", (torch::randn({4, 3}) * 0.5).t());  // (3, 4), not contiguous
  }
  at::Tensor forward(const at::Tensor& x) { return x.mm(w).tanh(); }
  at::Tensor w;
};

TEST(Sharded, ANonContiguousParameterTrainsAsInOneProcess) {
  for_worlds({2, 3}, [] {
    auto model = std::make_shared<Transposed>(), ref = std::make_shared<Transposed>();
    RANK_CHECK(!model->w.is_contiguous());
    ShardedDataParallel sdp(model);
    RANK_CHECK(sdp.parameters()[0].requires_grad(), "the shard of a non-contiguous parameter must want a gradient");
    train_beside_one_process(sdp, *model, *ref, 3, 4, "w");
  });
}

}  // namespace
}  // namespace chorus::test
