#include "torch_harness.h"

#include "chorus/core/supervisor.h"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace chorus::test {

void run_world(int world, const std::function<void()>& body, std::chrono::milliseconds timeout) {
  SCOPED_TRACE(detail::concat("world size ", world));
  expect_all_ok(run_ranks(world, [&](RankContext& ctx) {
    for (const auto& [k, v] : launcher_environment(single_node(ctx.rank, world, ctx.store_port, "torch-test")))
      setenv(k.c_str(), v.c_str(), 1);
    at::set_num_threads(1);
    init_process_group({.timeout = timeout});
    body();
    destroy_process_group();
  }));
}

void for_worlds(std::initializer_list<int> worlds, const std::function<void()>& body) {
  for (int w : worlds) run_world(w, body);
}

bool in_shared_memory(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> begin >> dash >> end;
    if (at >= begin && at < end) return line.find("/dev/shm/") != std::string::npos;
  }
  return false;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.is_complex()) return at::equal(at::view_as_real(a.resolve_conj()), at::view_as_real(b.resolve_conj()));
  if (a.is_floating_point()) {
    auto x = a.to(at::kDouble), y = b.to(at::kDouble);
    return (x.eq(y) | (x.isnan() & y.isnan())).all().item<bool>();
  }
  return at::equal(a, b);
}

std::string show(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream out;
  out << c10::toString(t.scalar_type()) << t.sizes();
  if (t.numel() <= 16) out << " " << t.reshape({-1}).to(t.is_complex() ? t.scalar_type() : at::kDouble);
  return out.str();
}

}  // namespace chorus::test
