// Elementwise reductions of several buffers into one: the only arithmetic the engine does.
#pragma once

#include <cstddef>

#include "chorus/core/dtype.h"

namespace chorus::reduce {

// dst[i] = ((srcs[0][i] op srcs[1][i]) op srcs[2][i]) ... in exactly this order, so every rank
// that folds the same inputs gets the same bits. Mean divides the sum by n. f16/bf16 accumulate
// in f32 and round once. Integers wrap. Bool: sum/max/bor = or, product/min/band = and.
// dst may alias any srcs[k] exactly (same address); partial overlap is not allowed.
// Picks the widest vector code this CPU runs. Does not validate (dtype, op): see reduce_op_problem.
//
// `copy`, when it has a destination, receives the same result in the same pass, block by block
// while each block is still in L1: a rank that publishes its folded part (dst, a shared slot)
// and keeps it (its output) writes both without reading the result back. With `stream` the
// copy is written with streaming stores (Note [Streaming stores] in shm/copy.h). copy.to may
// alias a source exactly, like dst, but not dst. With `stream_dst`, dst is written with streaming
// stores too, whether or not there is a copy (Note [Streaming into the slots] in shm/slot_stores.h).
// `mean_of`, when set, is what Mean divides by instead of n: the last fold of a partial sum (Note
// [Ring through the slots] in shm/all_reduce.cc).
struct Copy {
  void* to = nullptr;
  bool stream = false;
  bool stream_dst = false;
  int mean_of = 0;
};
void reduce(DataType dtype, ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, Copy copy = {});

// Per-ISA builds of the same source, chosen by reduce().
void reduce_generic(DataType, ReduceOp, const void* const*, int, void*, size_t, Copy);
void reduce_avx2(DataType, ReduceOp, const void* const*, int, void*, size_t, Copy);
void reduce_avx512(DataType, ReduceOp, const void* const*, int, void*, size_t, Copy);

}  // namespace chorus::reduce
