// Every collective, swept over world size x element count x dtype x op x in-place, in real
// processes; once with a tiny slot so every algorithm runs many rounds, once with the default
// slot (inline, one-shot and pipelined paths). Each rank checks its own result against a
// reference computed here.
#include <gtest/gtest.h>

#include <numeric>

#include "sweep.h"

namespace chorus::test {
namespace {

class Sweep : public ::testing::TestWithParam<SweepConfig> {};

TEST_P(Sweep, EveryCollectiveDtypeOpAndCount) {
  const SweepConfig config = GetParam();
  CommunicatorOptions options;
  options.backend = config.backend;
  options.shm_chunk_bytes = config.chunk_bytes;
  options.timeout = std::chrono::seconds(120);
  auto results = run_group(config.world, [&](Communicator& comm) { sweep(comm, config); }, options,
                           std::chrono::seconds(800));
  expect_all_ok(results);
  EXPECT_TRUE(leftover_segments(results).empty());
}

std::vector<SweepConfig> configs() {
  std::vector<SweepConfig> out;
  for (const std::string& backend : test_backends()) {
    if (backend == "shm") {
      for (int w : {1, 2, 3, 4, 7}) {
        out.push_back({"shm", w, 512, {0, 1, 17, 4099}});         // many rounds through a tiny slot
        out.push_back({"shm", w, 0, {0, 1, 4099, (1u << 20) + 3}});  // inline, one-shot, pipelined
      }
      continue;
    }
    // The engines (Gloo's TCP on loopback, MPI under mpirun -np 4), whose algorithms change
    // with the message size (Gloo's ring splits large messages in segments of 1 MiB).
    for (int w : {1, 2, 3, 4}) out.push_back({backend, w, 0, {0, 1, 17, 4099, (1u << 18) + 3}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Core, Sweep, ::testing::ValuesIn(configs()), [](const auto& info) {
  if (info.param.backend != "shm") return detail::concat(info.param.backend, "_W", info.param.world);
  return detail::concat("W", info.param.world, info.param.chunk_bytes ? "_small_chunks" : "_default_chunks");
});

}  // namespace
}  // namespace chorus::test
