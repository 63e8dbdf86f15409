// A tour of the torch layer. Run it as is and it starts 3 processes itself (Fabric::launch);
// under chorusrun, torchrun-style variables, mpirun or srun it joins whatever was started.
//   ./fabric_tour [--devices N]
#include <chorus/chorus.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  int devices = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--devices") == 0) devices = std::atoi(argv[i + 1]);
  at::set_num_threads(1);  // ranks share the cores

  chorus::Fabric fabric({.devices = devices});
  fabric.launch();
  const int rank = fabric.global_rank(), world = fabric.world_size();
  fabric.print("fabric_tour:", world, "ranks");

  // Tensors: a new tensor with the mean over ranks; every rank's tensor stacked.
  at::Tensor loss = at::full({}, float(rank));
  at::Tensor mean = fabric.all_reduce(loss);
  at::Tensor all = fabric.all_gather(at::full({2}, float(rank)));  // (world, 2)

  // Collections keep their structure; numbers stay numbers.
  c10::impl::GenericDict metrics(c10::StringType::get(), c10::AnyType::get());
  metrics.insert("correct", int64_t(10 * (rank + 1)));
  metrics.insert("loss_sum", at::full({}, 0.5 * rank, at::kDouble));
  auto total = fabric.all_reduce(c10::IValue(metrics), nullptr, chorus::ReduceOp::Sum).toGenericDict();

  // Objects of any shape from one rank; rank 0 prepares, the others follow.
  auto config = chorus::compute_and_broadcast([] { return std::map<std::string, double>{{"lr", 3e-4}}; });
  fabric.rank_zero_first([&] { /* e.g. download and cache a dataset once */ });

  fabric.print("mean loss", mean.item<float>(), "| gathered", all.size(0), "rows | correct",
               total.at("correct").toInt(), "| lr", config.at("lr"));
  const bool ok = mean.item<float>() == float(world - 1) / 2 && all.size(0) == world &&
                  total.at("correct").toInt() == 5 * world * (world + 1) && config.at("lr") == 3e-4;
  fabric.barrier();
  return ok ? 0 : 1;
}
