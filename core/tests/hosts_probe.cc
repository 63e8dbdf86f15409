// The worker of tests/two_hosts.sh: started by chorusrun on each "host" (a network namespace),
// it joins the group with backend "auto", prints which path the group took, and runs the whole
// collective sweep (large enough messages take the hierarchical all_reduce). With --hang it
// instead loops on all_reduce until a peer fails and prints the error it got.
#include <cstdio>
#include <cstring>

#include "chorus/core/environment.h"
#include "chorus/core/rendezvous.h"
#include "sweep.h"

int main(int argc, char** argv) {
  using namespace chorus;
  const bool hang = argc > 1 && std::strcmp(argv[1], "--hang") == 0;
  const auto env = Environment::detect();
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(120);
  auto comm = Communicator::create(connect_store(env), env.rank, env.world_size, options);
  std::printf("rank %d of %d: backend %s, %d hosts\n", comm->rank(), comm->size(), comm->backend_name().c_str(),
              comm->host_count());
  std::fflush(stdout);
  if (hang) {
    std::vector<float> buf(1 << 20, 1.0f);
    try {
      for (;;) comm->all_reduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Max);
    } catch (const std::exception& e) {
      std::printf("rank %d: %s\n", comm->rank(), e.what());
      return 2;
    }
  }
  try {
    test::sweep(*comm, {"auto", comm->size(), 0, {0, 1, 4099, 70001}});
  } catch (const std::exception& e) {
    std::printf("rank %d: FAILED %s\n", comm->rank(), e.what());
    return 1;
  }
  std::printf("rank %d: every collective correct\n", comm->rank());
  return 0;
}
