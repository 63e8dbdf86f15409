// Built against an installed chorus: starts 2 ranks and checks an all_reduce and an object.
#include <chorus/chorus.h>

#include <cstdio>

int main() {
  chorus::Fabric fabric({.devices = 2});
  fabric.launch();
  at::Tensor sum = fabric.all_reduce(at::full({3}, float(fabric.global_rank() + 1)), nullptr, chorus::ReduceOp::Sum);
  auto word = chorus::compute_and_broadcast([] { return std::string("installed"); });
  const bool ok = sum[0].item<float>() == 3.0f && word == "installed";
  fabric.print("consumer:", ok ? "ok" : "WRONG", "on", fabric.world_size(), "ranks");
  fabric.barrier();
  return ok ? 0 : 1;
}
