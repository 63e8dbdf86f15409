// The shared-memory collectives, one file each, all written in ShmGroup's phases
// (Note [Phases]). Each runs after ShmGroup::start() and syncs at least once, which is where the
// call is checked against the other ranks' (Note [Comparing calls]).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "call.h"
#include "shm/shm_group.h"

namespace chorus::shm {

void all_reduce(ShmGroup& g, const Call& c);  // AllReduce and Reduce
void broadcast(ShmGroup& g, const Call& c);
void gather(ShmGroup& g, const Call& c);  // AllGather(V) and Gather(V)
void scatter(ShmGroup& g, const Call& c);
void reduce_scatter(ShmGroup& g, const Call& c);
void all_to_all(ShmGroup& g, const Call& c);  // AllToAll and AllToAllV
void send(ShmGroup& g, const Call& c);
void recv(ShmGroup& g, const Call& c);
void recv_any(ShmGroup& g, const Call& c);  // RecvAny: sets *c.source

// Elements of round k when `total` elements go `per_round` at a time.
inline size_t in_round(size_t total, size_t per_round, size_t k) {
  const size_t begin = k * per_round;
  return begin >= total ? 0 : std::min(per_round, total - begin);
}
inline size_t rounds_for(size_t total, size_t per_round) { return (total + per_round - 1) / per_round; }

// memcpy that accepts null pointers when there is nothing to copy.
inline void copy_bytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

inline void move_bytes(void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

// Scratch for the source pointers of a reduction, reused across calls on this thread.
inline std::vector<const void*>& source_list(int n) {
  thread_local std::vector<const void*> v;
  v.resize(size_t(n));
  return v;
}

}  // namespace chorus::shm
