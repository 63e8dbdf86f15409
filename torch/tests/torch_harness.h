// Runs a test body in W real processes, each with chorus's default group initialized from a
// chorusrun-style environment pointing at the test's store.
#pragma once

#include <chorus/chorus.h>

#include <chrono>
#include <functional>
#include <initializer_list>

#include "multiprocess.h"

namespace chorus::test {

// Forks `world` ranks; each sets the launcher variables, calls init_process_group (with
// `timeout` as every call's deadline), runs body, and destroys the group. Reports failures per
// rank as gtest failures.
void run_world(int world, const std::function<void()>& body,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));
// run_world for each world size.
void for_worlds(std::initializer_list<int> worlds, const std::function<void()>& body);

// Inside a rank: the tensors are equal in dtype, shape and every value (NaNs equal).
#define RANK_CHECK_EQUAL(a, b) \
  RANK_CHECK(::chorus::test::same(a, b), "\n  got  ", ::chorus::test::show(a), "\n  want ", ::chorus::test::show(b))
bool same(const at::Tensor& a, const at::Tensor& b);
std::string show(const at::Tensor& t);

// Inside a rank: `p` lies in a shared-memory mapping (/dev/shm, where chorus's symmetric memory
// lives), as /proc/self/maps says.
bool in_shared_memory(const void* p);

}  // namespace chorus::test
