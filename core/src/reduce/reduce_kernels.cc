#include "reduce/reduce_kernels.h"

namespace chorus::reduce {
namespace {
using Fn = void (*)(DataType, ReduceOp, const void* const*, int, void*, size_t, Copy);
Fn pick() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c"))
    return &reduce_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return &reduce_avx2;
#endif
  return &reduce_generic;
}
}  // namespace

void reduce(DataType dtype, ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, Copy copy) {
  static const Fn fn = pick();
  fn(dtype, op, srcs, n, dst, count, copy);
}

}  // namespace chorus::reduce
