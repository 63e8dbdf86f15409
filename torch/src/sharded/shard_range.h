// The one rule for where a sharded parameter's elements lie (FSDP2's even Shard(0) of the
// flattened parameter): N elements over W ranks, each rank holding S = ceil(N / W) of them, rank
// r's real ones being [r*S, min(N, (r+1)*S)) of the flat parameter and the rest of its S padding.
// ShardedDataParallel shards by it, GatheredParameters re-slices by it, checkpoints cut by it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace chorus::detail {

inline int64_t shard_numel(int64_t numel, int world) { return (numel + world - 1) / world; }

struct ShardRange {
  int64_t begin = 0, end = 0;  // of the flat parameter
  int64_t size() const { return end - begin; }
};

// Rank `rank`'s real elements of a parameter of `numel` elements in shards of `shard` elements.
inline ShardRange shard_range(int64_t numel, int64_t shard, int rank) {
  const int64_t begin = std::min(numel, rank * shard);
  return {begin, std::min(numel, begin + shard)};
}

}  // namespace chorus::detail
