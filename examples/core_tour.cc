// The README's tour of the core, as a program: run it alone, or under a launcher
// (mpirun -np 4 ./core_tour, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand).
#include <chorus/core/communicator.h>
#include <chorus/core/environment.h>
#include <chorus/core/rendezvous.h>

#include <cstdio>
#include <vector>

int main() {
  auto env = chorus::Environment::detect();  // torchrun / chorusrun / mpirun / srun / env:// variables
  auto store = chorus::connect_store(env);   // rank 0 serves it unless the launcher does
  auto comm = chorus::Communicator::create(store, env.rank, env.world_size, {.timeout = std::chrono::seconds(60)});

  std::vector<float> grad(1 << 20, float(comm->rank() + 1));
  comm->all_reduce(grad.data(), grad.data(), grad.size(), chorus::DataType::Float32,
                   chorus::ReduceOp::Mean);  // in place, identical bits on every rank
  // Collectives queued to run in the background, in order; the Work says when they are done.
  auto work = comm->submit([&] { comm->broadcast(grad.data(), grad.size(), chorus::DataType::Float32, /*root=*/0); });
  work->wait();
  std::vector<int> evens;
  for (int r = 0; r < comm->size(); r += 2) evens.push_back(r);
  auto even = comm->split(evens);  // a subgroup; null on ranks not in the list

  const float want = float(comm->size() + 1) / 2;
  std::printf("rank %d of %d (%s): mean %.2f (want %.2f), in the even group: %s\n", comm->rank(), comm->size(),
              std::string(chorus::to_string(env.launcher)).c_str(), grad[0], want, even ? "yes" : "no");
  comm->barrier();   // keep rank 0's store up until everyone is done
  comm->shutdown();  // leaves in order: raises what the last call left unchecked
  return grad[0] == want ? 0 : 1;
}
