// chorus-torch-bench: the torch layer's costs that matter, each next to its baseline in the same
// run (median ms on rank 0, results verified every iteration):
//   object broadcast: a dict holding 100 MB of f32 tensors (4 x 25 MB) with Fabric::broadcast,
//     against broadcasting the same bare tensors in place (ProcessGroup::broadcast_);
//   collection all_reduce: a dict of 1,000 small tensors with one Fabric::all_reduce, against
//     1,000 Fabric::all_reduce calls and 1,000 in-place ProcessGroup::all_reduce_ calls.
// Starts its own ranks (Fabric::launch) unless a launcher did.
#include <chorus/chorus.h>

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

namespace {

using Clock = std::chrono::steady_clock;

// Median and p90 of fn's time in ms over iters runs (after one warm-up); every rank times, rank 0
// reports. prepare(i) runs untimed before each run (to vary the data).
std::pair<double, double> measure(int iters, const std::function<void(int)>& prepare,
                                  const std::function<void(int)>& fn) {
  prepare(-1);
  fn(-1);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    prepare(i);
    chorus::barrier();
    auto t0 = Clock::now();
    fn(i);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 9 / 10)]};
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "chorus-torch-bench: wrong result in %s\n", what);
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-torch-bench: object broadcast and collection all_reduce, each next to its baseline"};
  int np = 2, iters = 10, leaves = 1000, leaf_elems = 16;
  std::string cases = "broadcast,all_reduce";
  app.add_option("--np", np, "ranks to start when no launcher did")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed runs per case")->check(CLI::PositiveNumber);
  app.add_option("--leaves", leaves, "tensors in the all_reduce dict")->check(CLI::PositiveNumber);
  app.add_option("--leaf-elems", leaf_elems, "f32 elements per tensor of that dict")->check(CLI::PositiveNumber);
  app.add_option("--cases", cases, "which cases: broadcast, all_reduce (comma-separated)");
  CLI11_PARSE(app, argc, argv);
  const bool run_broadcast = cases.find("broadcast") != std::string::npos;
  const bool run_all_reduce = cases.find("all_reduce") != std::string::npos;

  at::set_num_threads(1);
  chorus::Fabric fabric({.devices = np});
  fabric.launch();
  const int me = fabric.global_rank(), w = fabric.world_size();
  auto g = chorus::default_group();
  fabric.print("# chorus-torch-bench: world", w, " iters", iters);
  fabric.print("case median_ms p90_ms");
  auto report = [&](const char* name, std::pair<double, double> r) {
    if (me == 0) std::printf("%s %.3f %.3f\n", name, r.first, r.second);
    std::fflush(stdout);
  };

  if (run_broadcast) {
    // ---- 100 MB dict of tensors, broadcast from rank 0 ----
    constexpr int64_t kElems = 25 * 1024 * 1024 / 4;
    std::vector<at::Tensor> bare;
    for (int i = 0; i < 4; ++i) bare.push_back(at::zeros({kElems}));
    auto fill = [&](int it) {
      if (me == 0)
        for (int i = 0; i < 4; ++i) bare[size_t(i)].fill_(float(it + 10 * i));
    };
    auto tail_ok = [&](const at::Tensor& t, int it, int i) {
      return t.numel() == kElems && t[kElems - 1].item<float>() == float(it + 10 * i) &&
             t[0].item<float>() == float(it + 10 * i);
    };
    auto dict = [&] {
      c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
      for (int i = 0; i < 4; ++i) d.insert("t" + std::to_string(i), bare[size_t(i)]);
      return c10::IValue(d);
    };
    report("broadcast_bare_100MB", measure(iters, fill, [&](int it) {
             for (auto& t : bare) g->broadcast_(t, 0);
             for (int i = 0; i < 4; ++i) check(tail_ok(bare[size_t(i)], it, i), "bare broadcast");
           }));
    report("broadcast_object_100MB_dict", measure(iters, fill, [&](int it) {
             auto got = fabric.broadcast(dict(), 0).toGenericDict();
             for (int i = 0; i < 4; ++i)
               check(tail_ok(got.at("t" + std::to_string(i)).toTensor(), it, i), "object broadcast");
           }));
  }

  if (run_all_reduce) {
    // ---- a dict of many small tensors, all_reduce(sum) ----
    std::vector<at::Tensor> small;
    for (int i = 0; i < leaves; ++i) small.push_back(at::empty({leaf_elems}));
    auto vary = [&](int it) {
      for (int i = 0; i < leaves; ++i) small[size_t(i)].fill_(float(me + it + i % 7));
    };
    const double ranks_sum = w * (w - 1) / 2.0;
    auto ok = [&](const at::Tensor& t, int it, int i) {
      return t[leaf_elems - 1].item<float>() == float(ranks_sum + w * (it + i % 7));
    };
    c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
    for (int i = 0; i < leaves; ++i) d.insert("p" + std::to_string(i), small[size_t(i)]);
    report("all_reduce_dict_coalesced", measure(iters, vary, [&](int it) {
             auto out = fabric.all_reduce(c10::IValue(d), nullptr, chorus::ReduceOp::Sum).toGenericDict();
             check(ok(out.at("p0").toTensor(), it, 0) &&
                       ok(out.at("p" + std::to_string(leaves - 1)).toTensor(), it, leaves - 1),
                   "coalesced all_reduce");
           }));
    report("all_reduce_separate_fabric", measure(iters, vary, [&](int it) {
             std::vector<at::Tensor> out;
             for (int i = 0; i < leaves; ++i)
               out.push_back(fabric.all_reduce(small[size_t(i)], nullptr, chorus::ReduceOp::Sum));
             check(ok(out.front(), it, 0) && ok(out.back(), it, leaves - 1), "separate all_reduce");
           }));
    report("all_reduce_separate_inplace", measure(iters, vary, [&](int it) {
             for (auto& t : small) g->all_reduce_(t, chorus::ReduceOp::Sum);
             check(ok(small.front(), it, 0) && ok(small.back(), it, leaves - 1), "in-place all_reduce");
           }));
  }
  chorus::barrier();
  return 0;
}
