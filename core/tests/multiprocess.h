// Runs a test body in W real processes that rendezvous through a TcpStore hosted by the test.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "chorus/core/communicator.h"
#include "chorus/core/error.h"

namespace chorus::test {

struct RankResult {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string report;  // what the rank wrote to its report pipe (failures)
  int pid = 0;
};

struct RankContext {
  int rank;
  int world;
  std::shared_ptr<Store> store;  // a client of the test's TcpStore
  int store_port;                // where that store listens, on 127.0.0.1
};

// Forks `world` processes; each runs body(ctx) and exits 0, or reports the exception's message
// and exits 1. Kills everything still running after `limit`. Under mpirun, processes 0..world-1
// of the job run the body instead (Note [Suites under mpirun]).
std::vector<RankResult> run_ranks(int world, const std::function<void(RankContext&)>& body,
                                  std::chrono::seconds limit = std::chrono::seconds(300));

// Same, with a Communicator made for each rank.
std::vector<RankResult> run_group(int world, const std::function<void(Communicator&)>& body,
                                  CommunicatorOptions options = {},
                                  std::chrono::seconds limit = std::chrono::seconds(300));

// The backends the suites run on: shm, and gloo when chorus was built with it; under mpirun,
// mpi only (Note [Suites under mpirun] in multiprocess.cc).
std::vector<std::string> test_backends();

// Names a test instance by its backend: Suite.Test/gloo.
inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// A test run once per backend (INSTANTIATE_TEST_SUITE_P(..., ValuesIn(test_backends()),
// backend_param_name)).
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  CommunicatorOptions options(std::chrono::milliseconds timeout = std::chrono::minutes(5)) const {
    CommunicatorOptions o;
    o.backend = GetParam();
    o.timeout = timeout;
    return o;
  }
};

// A gtest failure for each rank that did not exit 0.
void expect_all_ok(const std::vector<RankResult>& results);

// Inside a rank: throws with the location when cond is false (the parent reports it).
#define RANK_CHECK(cond, ...)                                                                              \
  do {                                                                                                     \
    if (!(cond))                                                                                           \
      throw std::runtime_error(                                                                            \
          ::chorus::detail::concat(__FILE__, ":", __LINE__, ": ", #cond, " " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// Inside a rank: binds this thread to CPU `cpu` alone, or throws naming it.
void bind_to_cpu(int cpu);

// Runs fn, which must throw E; returns its message. Throws otherwise.
template <class E, class F>
std::string expect_throw(F&& fn, const char* where) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(where) + ": threw the wrong type: " + e.what());
  }
  throw std::runtime_error(std::string(where) + ": did not throw");
}
#define RANK_EXPECT_THROW(E, stmt) \
  ::chorus::test::expect_throw<E>([&] { stmt; }, __FILE__ ":" CHORUS_TEST_STR(__LINE__))
#define CHORUS_TEST_STR2(x) #x
#define CHORUS_TEST_STR(x) CHORUS_TEST_STR2(x)

// /dev/shm entries left by segments that these ranks created.
std::vector<std::string> leftover_segments(const std::vector<RankResult>& ranks);

}  // namespace chorus::test
