// Checkpoints in real multi-process runs: every strategy saves in both formats at W = 1..4 and
// every strategy loads every one of them at W' = 1..4; references travel between the runs as
// torch::pickle_save files written by the saving world's rank 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "chorus/core/supervisor.h"
#include "torch_harness.h"

namespace chorus::test {
namespace {

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;

enum class Mode { DDP, FullShard, ShardGradOp };
const Mode kModes[] = {Mode::DDP, Mode::FullShard, Mode::ShardGradOp};
const char* name_of(Mode m) { return m == Mode::DDP ? "ddp" : m == Mode::FullShard ? "full_shard" : "shard_grad_op"; }

struct Net : torch::nn::Module {
  explicit Net(uint64_t seed) {
    torch::manual_seed(seed);
    l1 = register_module("l1", torch::nn::Linear(7, 15));
    l2 = register_module("l2", torch::nn::Linear(15, 3));
    scale = register_buffer("scale", torch::ones({3}));
  }
  at::Tensor forward(const at::Tensor& x) { return l2(torch::relu(l1(x))) * scale; }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  at::Tensor scale;
};

// One strategy's model, wrapper and Adam, trained on a global batch split over the ranks.
struct Trainer {
  Trainer(Mode mode, uint64_t seed) : mode(mode), net(std::make_shared<Net>(seed)) {
    if (mode == Mode::DDP) {
      ddp = std::make_unique<DistributedDataParallel>(net);
      opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
    } else {
      ShardedOptions o;
      o.strategy = mode == Mode::FullShard ? ShardingStrategy::FullShard : ShardingStrategy::ShardGradOp;
      o.units = {net->l1.ptr(), net->l2.ptr()};
      sdp = std::make_unique<ShardedDataParallel>(net, o);
      opt = std::make_unique<torch::optim::Adam>(sdp->parameters(), torch::optim::AdamOptions(0.01));
    }
  }
  void train(int from, int steps) {
    step = from + steps;
    const int w = default_group()->size(), r = default_group()->rank(), per = 12 / w;
    for (int k = from; k < from + steps; ++k) {
      auto gen = at::detail::createCPUGenerator(uint64_t(100 + k));
      at::Tensor x = at::randn({12, 7}, gen), y = at::randn({12, 3}, gen);
      x = x.narrow(0, r * per, per);
      y = y.narrow(0, r * per, per);
      opt->zero_grad();
      auto loss = [&] { return torch::mse_loss(net->forward(x), y); };
      (sdp ? sdp->forward(loss) : loss()).backward();
      opt->step();
      at::NoGradGuard no_grad;
      net->scale.add_(0.25);  // a buffer that changes, equally on every rank
    }
  }
  CheckpointState state() { return {{"model", net}, {"optimizer", *opt}, {"step", step}}; }

  // Collective: full parameters, buffers and Adam state, as one process would hold them.
  Dict full_view() {
    Dict out(c10::StringType::get(), c10::AnyType::get());
    auto params = net->named_parameters();
    std::vector<at::Tensor> held = opt->param_groups()[0].params();
    {
      GatheredParameters gathered(std::vector<std::shared_ptr<torch::nn::Module>>{net});
      for (const auto& p : params) out.insert("param/" + p.key(), p.value().detach().clone());
    }
    out.insert("buffer/scale", net->scale.clone());
    for (size_t i = 0; i < held.size(); ++i) {
      const at::Tensor& p = params[i].value();
      auto& st = static_cast<torch::optim::AdamParamState&>(*opt->state().at(held[i].unsafeGetTensorImpl()));
      for (auto [name, t] : {std::make_pair("exp_avg", st.exp_avg()), std::make_pair("exp_avg_sq", st.exp_avg_sq())}) {
        at::Tensor full = t;
        if (sdp) full = default_group()->all_gather(t.contiguous()).reshape({-1}).narrow(0, 0, p.numel());
        out.insert(std::string("adam/") + name + "/" + params[i].key(), full.reshape(p.sizes()).clone());
      }
      out.insert("adam/step/" + params[i].key(), st.step());
    }
    return out;
  }

  Mode mode;
  std::shared_ptr<Net> net;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;
  std::unique_ptr<torch::optim::Adam> opt;
  int64_t step = 0;  // the training step, saved and loaded as "step"
};

void write_ref(const std::string& path, const Dict& d) {
  std::vector<char> bytes = torch::pickle_save(d);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}
Dict read_ref(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

// Every entry of `want` in `got`: bitwise, or within tol.
void check_view(const Dict& got, const Dict& want, double tol, const std::string& what) {
  for (const auto& e : want) {
    const std::string key = e.key().toStringRef();
    RANK_CHECK(got.contains(key), what, ": no ", key);
    if (e.value().isInt()) {
      RANK_CHECK(got.at(key).toInt() == e.value().toInt(), what, ": ", key);
      continue;
    }
    const at::Tensor a = got.at(key).toTensor(), b = e.value().toTensor();
    if (tol == 0)
      RANK_CHECK(same(a, b), what, ": ", key, " differs bitwise\n  got  ", show(a), "\n  want ", show(b));
    else
      RANK_CHECK((a - b).abs().max().item<double>() <= tol, what, ": ", key, " differs by ",
                 (a - b).abs().max().item<double>());
  }
}

at::Tensor rng_draws() { return default_group()->all_gather(torch::rand({4})); }

std::string scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("chorus-ckpt-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

TEST(Checkpoint, EveryStrategyAndFormatRoundTripsAcrossWorldSizes) {
  const std::string dir = scratch("matrix");
  const std::vector<int> worlds = {1, 2, 3, 4};
  for (int w : worlds)
    run_world(w, [&] {
      for (Mode m : kModes) {
        Trainer t(m, 1);
        t.train(0, 3);
        const std::string base = dir + "/w" + std::to_string(w) + "-" + name_of(m);
        save_checkpoint(base + "-full.pt", t.state(), {.format = CheckpointFormat::Full});
        save_checkpoint(base + "-sharded", t.state(), {.format = CheckpointFormat::Sharded});
        Dict ref = t.full_view();
        ref.insert("rng", rng_draws());
        t.train(3, 3);
        Dict cont = t.full_view();
        if (default_group()->rank() == 0) {
          write_ref(base + "-ref.pt", ref);
          write_ref(base + "-cont.pt", cont);
        }
        default_group()->barrier();
      }
    });
  for (int w2 : worlds)
    run_world(w2, [&] {
      for (int w : worlds)
        for (Mode saved : kModes)
          for (const char* format : {"full.pt", "sharded"})
            for (Mode m : kModes) {
              const std::string base = dir + "/w" + std::to_string(w) + "-" + name_of(saved);
              const std::string what = detail::concat(name_of(saved), " W=", w, " ", format, " -> ", name_of(m),
                                                      " W'=", default_group()->size());
              Trainer t(m, 2);                // other initial values: the load must replace them
              if (m == saved) t.train(7, 1);  // Adam state exists: loaded in place (else made by the load)
              Dict rest = load_checkpoint(base + "-" + format, t.state());
              RANK_CHECK(t.step == 3 && rest.size() == 0, what, ": step ", t.step);
              Dict ref = read_ref(base + "-ref.pt");
              const at::Tensor draws = rng_draws();
              if (w == default_group()->size())
                RANK_CHECK(same(draws, ref.at("rng").toTensor()), what, ": RNG not restored");
              (void)ref.erase("rng");
              check_view(t.full_view(), ref, 0, what + " after load");
              t.train(3, 3);
              const bool same_run = w == default_group()->size() && m == saved;
              check_view(t.full_view(), read_ref(base + "-cont.pt"), same_run ? 0 : 1e-5, what + " continued");
            }
    });
  fs::remove_all(dir);
}

TEST(Checkpoint, FullFileIsTorchLoadableAndRemainderComesBack) {
  const std::string dir = scratch("full");
  run_world(2, [&] {
    Trainer t(Mode::FullShard, 1);
    t.train(0, 2);
    std::string note = "hello";
    CheckpointState state = t.state();
    state.emplace_back("note", note);
    save_checkpoint(dir + "/c.pt", state, {.format = CheckpointFormat::Full});
    Dict want = t.full_view();
    // A plain LibTorch program reads it with torch::pickle_load: {item: value}.
    std::ifstream in(dir + "/c.pt", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Dict all = torch::pickle_load(bytes).toGenericDict();
    Dict model = all.at("model").toGenericDict();
    RANK_CHECK(same(model.at("l1.weight").toTensor(), want.at("param/l1.weight").toTensor()));
    RANK_CHECK(same(model.at("scale").toTensor(), want.at("buffer/scale").toTensor()));
    Dict adam = all.at("optimizer").toGenericDict();
    RANK_CHECK(adam.at("type").toStringRef() == "Adam");
    RANK_CHECK(same(adam.at("state").toGenericDict().at("model.l2.bias").toGenericDict().at("exp_avg").toTensor(),
                    want.at("adam/exp_avg/l2.bias").toTensor()));
    RANK_CHECK(all.at("step").toInt() == 2 && all.at("note").toStringRef() == "hello");
    // Loading only the model gives back the rest.
    auto fresh = std::make_shared<Net>(5);
    Dict rest = load_checkpoint(dir + "/c.pt", {{"model", fresh}});
    RANK_CHECK(rest.contains("optimizer") && rest.contains("note") && rest.at("step").toInt() == 2, "remainder has ",
               rest.size(), " items");
    RANK_CHECK(same(fresh->l1->weight, want.at("param/l1.weight").toTensor()));
    RANK_CHECK(describe_checkpoint(dir + "/c.pt").find("model: module:full_shard") != std::string::npos,
               describe_checkpoint(dir + "/c.pt"));
  });
  // Python's torch.load (weights_only, its default since 2.6) reads the same file.
  if (std::string(CHORUS_PYTHON).empty()) {
    std::cout << "no Python with torch was found at configure time: torch.load not tried" << std::endl;
  } else {
    const std::string py = std::string(CHORUS_PYTHON) + " -c \"import torch; d = torch.load('" + dir +
                           "/c.pt'); assert d['step'] == 2 and tuple(d['model']['l1.weight'].shape) == (15, 7), d\"";
    EXPECT_EQ(std::system(py.c_str()), 0) << py;
  }
  fs::remove_all(dir);
}

// Runs body in W ranks; every rank must throw InvalidArgument whose message has `needle`.
void expect_load_error(int world, const std::string& path, const std::string& needle, Mode mode = Mode::DDP) {
  run_world(world, [&] {
    Trainer t(mode, 2);
    std::string what = RANK_EXPECT_THROW(InvalidArgument, load_checkpoint(path, t.state()));
    RANK_CHECK(what.find(needle) != std::string::npos, "message: ", what, "\n  expected it to say: ", needle);
  });
}

TEST(Checkpoint, BadCheckpointsAreNamedOnEveryRank) {
  const std::string dir = scratch("bad");
  run_world(3, [&] {
    Trainer t(Mode::FullShard, 1);
    t.train(0, 1);
    save_checkpoint(dir + "/s", t.state());  // sharded (Auto)
    save_checkpoint(dir + "/f.pt", t.state(), {.format = CheckpointFormat::Full});
  });
  auto data_file = [&](int rank) {
    const std::string tag = detail::concat("-", rank, "-of-3.bin");
    for (const auto& e : fs::directory_iterator(dir + "/s"))
      if (e.path().filename().string().find(tag) != std::string::npos) return e.path().string();
    return std::string();
  };
  auto copy = [&](const std::string& name) {
    fs::remove_all(dir + "/" + name);
    fs::copy(dir + "/s", dir + "/" + name, fs::copy_options::recursive);
    return dir + "/" + name;
  };
  expect_load_error(2, dir + "/none", "does not exist");
  // A rank's shards missing.
  {
    std::string c = copy("missing");
    const std::string f = data_file(2);
    fs::remove(c + "/" + fs::path(f).filename().string());
    expect_load_error(2, c, fs::path(f).filename().string() + "' is missing");
  }
  // Truncated and corrupted data.
  {
    std::string c = copy("truncated");
    const std::string f = c + "/" + fs::path(data_file(1)).filename().string();
    fs::resize_file(f, fs::file_size(f) / 2);
    expect_load_error(2, c, "is truncated");
  }
  {
    std::string c = copy("corrupt");
    const std::string f = c + "/" + fs::path(data_file(0)).filename().string();
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(16);
    io.put('\x55');
    io.close();
    expect_load_error(4, c, "is corrupt");
  }
  {
    std::string c = copy("meta");
    std::fstream io(c + "/metadata", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);
    io.put('\x55');
    io.close();
    expect_load_error(2, c, "metadata' is corrupt");
  }
  {
    const std::string f = dir + "/cut.pt";
    fs::copy_file(dir + "/f.pt", f);
    fs::resize_file(f, fs::file_size(f) - 100);
    expect_load_error(2, f, "cut.pt' is not a chorus checkpoint");
  }
  // Another model: other shapes, other names.
  run_world(2, [&] {
    auto other = std::make_shared<torch::nn::Module>();
    other->register_module("l1", torch::nn::Linear(7, 16));
    std::string what = RANK_EXPECT_THROW(InvalidArgument, load_checkpoint(dir + "/s", {{"model", other}}));
    RANK_CHECK(what.find("'model/l1.weight' is Float[15, 7] in") != std::string::npos, what);
    auto renamed = std::make_shared<torch::nn::Module>();
    renamed->register_module("first", torch::nn::Linear(7, 15));
    what = RANK_EXPECT_THROW(InvalidArgument, load_checkpoint(dir + "/f.pt", {{"model", renamed}}));
    RANK_CHECK(what.find("has no 'model/first.weight'") != std::string::npos, what);
    torch::optim::SGD sgd(std::vector<at::Tensor>{torch::zeros({1}, torch::requires_grad())}, 0.1);
    auto net = std::make_shared<Net>(0);
    what = RANK_EXPECT_THROW(InvalidArgument, load_checkpoint(dir + "/s", {{"model", net}, {"optimizer", sgd}}));
    RANK_CHECK(what.find("holds a Adam optimizer as 'optimizer', this one is SGD") != std::string::npos, what);
  });
  fs::remove_all(dir);
}

// Ranks that save different states: every rank raises CollectiveMismatch showing each rank's
// first differing line, and nothing is written.
TEST(Checkpoint, RanksSavingDifferentStatesAreAMismatchShowingEachRanksLine) {
  const std::string dir = scratch("mismatch");
  run_world(2, [&] {
    auto m = std::make_shared<torch::nn::Module>();
    m->register_module("l1", torch::nn::Linear(7, default_group()->rank() == 1 ? 16 : 15));
    std::string what = RANK_EXPECT_THROW(CollectiveMismatch, save_checkpoint(dir + "/m", {{"model", m}}));
    RANK_CHECK(what.find("save_checkpoint on group 'world': every rank must save the same state") != std::string::npos,
               what);
    RANK_CHECK(what.find("rank 0: model/l1.weight Float[15, 7]") != std::string::npos, what);
    RANK_CHECK(what.find("rank 1: model/l1.weight Float[16, 7]") != std::string::npos, what);
    RANK_CHECK(!fs::exists(dir + "/m"));
  });
  fs::remove_all(dir);
}

// A rank killed at any moment of a save: the path then holds the previous checkpoint or the new
// one, whole; never a mix, never nothing.
TEST(Checkpoint, AKilledRankNeverLeavesAHalfWrittenCheckpoint) {
  const std::string dir = scratch("kill");
  for (int delay_ms : {0, 3, 10, 30}) {
    for (const char* name : {"s", "f.pt"}) {
      const std::string path = dir + "/" + name;
      const bool full = std::string(name) == "f.pt";
      run_world(2, [&] {
        Trainer t(Mode::FullShard, 1);
        t.step = 1;
        save_checkpoint(path, t.state(), {.format = full ? CheckpointFormat::Full : CheckpointFormat::Sharded});
      });
      auto results = run_ranks(2, [&](RankContext& ctx) {
        for (const auto& [k, v] : launcher_environment(single_node(ctx.rank, 2, ctx.store_port, "ckpt-kill")))
          setenv(k.c_str(), v.c_str(), 1);
        init_process_group({.timeout = std::chrono::seconds(20)});
        Trainer t(Mode::FullShard, 1);
        t.train(0, 1);
        t.step = 2;  // saved over the step-1 checkpoint
        if (ctx.rank == 1)
          std::thread([delay_ms] {
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            kill(getpid(), SIGKILL);
          }).detach();
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < until)  // the kill lands somewhere in these saves
          save_checkpoint(path, t.state(), {.format = full ? CheckpointFormat::Full : CheckpointFormat::Sharded});
      });
      EXPECT_EQ(results[1].signal, SIGKILL);
      EXPECT_NE(results[0].exit_code, 0) << "rank 0 must see its peer die";
      run_world(1, [&] {
        Trainer t(Mode::DDP, 2);
        load_checkpoint(path, t.state());
        RANK_CHECK(t.step == 1 || t.step == 2, "step ", t.step);
      });
    }
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, SgdMomentumAndPlainModulesAndFabric) {
  const std::string dir = scratch("sgd");
  run_world(3, [&] {
    Fabric fabric;
    auto net = std::make_shared<Net>(4);
    auto& ddp = fabric.setup(net);
    (void)ddp;
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int k = 0; k < 2; ++k) {
      opt.zero_grad();
      torch::mse_loss(net->forward(torch::ones({2, 7}) * k), torch::zeros({2, 3})).backward();
      opt.step();
    }
    double lr_seen = 0.1;
    fabric.save(dir + "/sgd.pt", {{"model", net}, {"optimizer", opt}, {"lr", lr_seen}});
    auto net2 = std::make_shared<Net>(9);
    torch::optim::SGD opt2(net2->parameters(), torch::optim::SGDOptions(0.5).momentum(0.1));
    double lr = 0;
    fabric.load(dir + "/sgd.pt", {{"model", net2}, {"optimizer", opt2}, {"lr", lr}});
    RANK_CHECK(lr == 0.1);
    auto& o = static_cast<torch::optim::SGDOptions&>(opt2.param_groups()[0].options());
    RANK_CHECK(o.lr() == 0.1 && o.momentum() == 0.9, "options restored: lr ", o.lr());
    auto p1 = net->parameters(), p2 = net2->parameters();
    for (size_t i = 0; i < p1.size(); ++i) {
      RANK_CHECK_EQUAL(p2[i], p1[i]);
      auto& a = static_cast<torch::optim::SGDParamState&>(*opt.state().at(p1[i].unsafeGetTensorImpl()));
      auto& b = static_cast<torch::optim::SGDParamState&>(*opt2.state().at(p2[i].unsafeGetTensorImpl()));
      RANK_CHECK_EQUAL(b.momentum_buffer(), a.momentum_buffer());
    }
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace chorus::test
