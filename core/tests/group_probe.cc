// The worker of the launcher-level tests. Started by a launcher (chorusrun on each "host" of
// tests/two_hosts.sh, mpirun in tests/mpi_rank_killed.sh), it joins the group (backend from
// CHORUS_BACKEND, "auto" by default), prints which path the group took, and runs the whole
// collective sweep (large enough messages take the hierarchical all_reduce). With --hang it
// instead loops on all_reduce until a peer fails and prints the error it got; --kill-rank R
// makes rank R kill itself with SIGKILL 300 ms into that loop. With --algorithms it runs the
// sweep once per forced set of algorithms between hosts (Note [Algorithms between hosts]), and
// checks that every rank ends with the same bits (float sums of random data included) and that
// the results are the same under every set wherever the algorithms reduce in the same order.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "chorus/core/environment.h"
#include "chorus/core/rendezvous.h"
#include "sweep.h"

namespace {

using namespace chorus;

uint64_t digest(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ULL;
  return h;
}

// Throws unless every rank of `comm` has the same digest.
void same_on_every_rank(Communicator& comm, uint64_t mine, const std::string& what) {
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.all_gather(&mine, all.data(), 1, DataType::Int64);
  for (int r = 0; r < comm.size(); ++r)
    if (all[size_t(r)] != all[0])
      throw std::runtime_error(detail::concat(what, ": rank ", r, "'s result differs from rank 0's"));
}

// Random data (the same for a rank under every set), through every collective: the results
// every rank gets must be bit-identical on every rank. Returns their digests, keyed by name, and
// the float all_reduce's sums themselves.
struct Results {
  std::vector<std::pair<std::string, uint64_t>> digests;
  std::vector<float> sums;
};
Results identical_results(Communicator& comm) {
  Results results;
  auto& out = results.digests;
  for (size_t n : {size_t(1000), size_t(70001)}) {
    std::mt19937 gen(uint32_t(comm.rank() * 7919 + n));
    std::uniform_real_distribution<float> real(-1.0f, 1.0f);
    std::vector<float> f(n * size_t(comm.size())), fr(n * size_t(comm.size()));
    std::vector<int32_t> k(n * size_t(comm.size())), kr(n * size_t(comm.size()));
    for (auto& x : f) x = real(gen);
    for (auto& x : k) x = int32_t(gen() % 100000) - 50000;
    const std::string size = detail::concat(" x ", n);
    comm.all_reduce(f.data(), fr.data(), n, DataType::Float32, ReduceOp::Sum);
    same_on_every_rank(comm, digest(fr.data(), n * 4), "all_reduce(f32 sum)" + size);
    results.sums.insert(results.sums.end(), fr.begin(), fr.begin() + long(n));
    comm.all_reduce(f.data(), fr.data(), n, DataType::Float32, ReduceOp::Max);
    same_on_every_rank(comm, digest(fr.data(), n * 4), "all_reduce(f32 max)" + size);
    out.emplace_back("all_reduce max" + size, digest(fr.data(), n * 4));
    comm.all_reduce(k.data(), kr.data(), n, DataType::Int32, ReduceOp::Sum);
    same_on_every_rank(comm, digest(kr.data(), n * 4), "all_reduce(i32 sum)" + size);
    out.emplace_back("all_reduce i32" + size, digest(kr.data(), n * 4));
    fr.assign(f.begin(), f.begin() + long(n));
    comm.broadcast(fr.data(), n, DataType::Float32, comm.size() - 1);
    same_on_every_rank(comm, digest(fr.data(), n * 4), "broadcast" + size);
    out.emplace_back("broadcast" + size, digest(fr.data(), n * 4));
    comm.all_gather(f.data(), fr.data(), n, DataType::Float32);
    same_on_every_rank(comm, digest(fr.data(), fr.size() * 4), "all_gather" + size);
    out.emplace_back("all_gather" + size, digest(fr.data(), fr.size() * 4));
    comm.reduce_scatter(k.data(), kr.data(), n, DataType::Int32, ReduceOp::Sum);  // each rank its own block:
    out.emplace_back("reduce_scatter i32" + size, digest(kr.data(), n * 4));      // compared between sets
    comm.reduce_scatter(f.data(), fr.data(), n, DataType::Float32, ReduceOp::Sum);
    out.emplace_back("float reduce_scatter" + size, digest(fr.data(), n * 4));
  }
  return results;
}

// Every forced set of algorithms, and the cost model's own choice. The results must be the same
// under every set wherever the algorithms reduce in the same order (Note [Algorithms between
// hosts]): all but the float all_reduce, whose sums are the same under every tree set and under
// every ring set, and each of the cost model's is the one of either kind.
int algorithms(const std::shared_ptr<Store>& store, int rank, int size) {
  struct Set {
    const char *label, *algorithms;
    bool ring;  // its all_reduce runs the ring
  };
  const Set sets[] = {
      {"auto", "", false},
      {"doubling_direct_binomial", "recursive_doubling,reduce_scatter=direct,all_gather=direct,broadcast=binomial",
       false},
      {"ring_scatter_ring", "ring,broadcast=scatter_ring", true},
      {"ring_chain", "ring,broadcast=chain", true},
      {"halving_doubling", "halving_doubling,reduce_scatter=ring,all_gather=direct,broadcast=scatter_ring", false}};
  std::vector<std::pair<std::string, uint64_t>> first;
  std::map<bool, std::vector<float>> kind;  // the float all_reduce sums of the first set of each kind
  std::vector<float> chosen;
  for (const auto& set : sets) {
    CommunicatorOptions options;
    options.timeout = std::chrono::seconds(120);
    options.name = detail::concat("algorithms-", set.label);
    options.cross.algorithm = set.algorithms;
    auto comm = Communicator::create(store, rank, size, options);
    try {
      test::sweep(*comm, {comm->backend_name(), comm->size(), 0, {1, 4099, 70001}});
      const auto got = identical_results(*comm);
      if (first.empty()) first = got.digests;
      for (size_t i = 0; i < got.digests.size(); ++i)
        if (got.digests[i].second != first[i].second)
          throw std::runtime_error(detail::concat(got.digests[i].first, " differs from the first set's"));
      if (set.algorithms[0] == 0)
        chosen = got.sums;  // checked against both kinds at the end
      else if (kind.count(set.ring) && std::memcmp(kind[set.ring].data(), got.sums.data(), got.sums.size() * 4))
        throw std::runtime_error(
            detail::concat("a float all_reduce differs from the first ", set.ring ? "ring" : "tree", " set's"));
      else
        kind[set.ring] = got.sums;
    } catch (const std::exception& e) {
      std::printf("rank %d: FAILED under %s: %s\n", rank, set.label, e.what());
      return 1;
    }
    std::printf("rank %d: %s: every collective correct and identical on every rank\n", rank, set.label);
    std::fflush(stdout);
  }
  size_t as_tree = 0, as_ring = 0;
  for (size_t e = 0; e < chosen.size(); ++e) {
    const bool tree = std::memcmp(&chosen[e], &kind[false][e], 4) == 0,
               ring = std::memcmp(&chosen[e], &kind[true][e], 4) == 0;
    if (!tree && !ring) {
      std::printf(
          "rank %d: FAILED: the cost model's float all_reduce, element %zu, is neither the ring's nor the tree's\n",
          rank, e);
      return 1;
    }
    as_tree += tree, as_ring += ring;
  }
  if (rank == 0)
    std::printf(
        "float sums the same under every set but the all_reduce's: the cost model's choice gave the trees' "
        "sum in %zu elements and the ring's in %zu of %zu\n",
        as_tree, as_ring, chosen.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool hang = false, algorithm_sets = false;
  int kill_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hang") == 0) hang = true;
    if (std::strcmp(argv[i], "--algorithms") == 0) algorithm_sets = true;
    if (std::strcmp(argv[i], "--kill-rank") == 0 && i + 1 < argc) kill_rank = std::atoi(argv[++i]);
  }
  const auto env = Environment::detect();
  if (algorithm_sets) return algorithms(connect_store(env), env.rank, env.world_size);
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
