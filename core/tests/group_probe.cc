// The worker of the launcher-level tests. Started by a launcher (chorusrun on each "host" of
// tests/two_hosts.sh, mpirun in tests/mpi_rank_killed.sh), it joins the group (backend from
// CHORUS_BACKEND, "auto" by default), prints which path the group took, and runs the whole
// collective sweep (large enough messages take the hierarchical all_reduce). With --hang it
// instead loops on all_reduce until a peer fails and prints the error it got; --kill-rank R
// makes rank R kill itself with SIGKILL 300 ms into that loop.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "chorus/core/environment.h"
#include "chorus/core/rendezvous.h"
#include "sweep.h"

int main(int argc, char** argv) {
  using namespace chorus;
  bool hang = false;
  int kill_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hang") == 0) hang = true;
    if (std::strcmp(argv[i], "--kill-rank") == 0 && i + 1 < argc) kill_rank = std::atoi(argv[++i]);
  }
  const auto env = Environment::detect();
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(120);
  auto comm = Communicator::create(connect_store(env), env.rank, env.world_size, options);
  std::printf("rank %d of %d: backend %s, %d hosts\n", comm->rank(), comm->size(), comm->backend_name().c_str(),
              comm->host_count());
  std::fflush(stdout);
  if (hang) {
    std::vector<float> buf(1 << 20, 1.0f);
    if (comm->rank() == kill_rank)
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        kill(getpid(), SIGKILL);
      }).detach();
    try {
      for (;;) comm->all_reduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Max);
    } catch (const std::exception& e) {
      std::printf("rank %d: %s\n", comm->rank(), e.what());
      return 2;
    }
  }
  try {
    test::sweep(*comm, {comm->backend_name(),
                        comm->size(),
                        0,
                        {0, 1, 4099, 70000, 70001}});  // even and odd: with and without a flat tail
  } catch (const std::exception& e) {
    std::printf("rank %d: FAILED %s\n", comm->rank(), e.what());
    return 1;
  }
  std::printf("rank %d: every collective correct\n", comm->rank());
  return 0;
}
