// Commits kept in the processes' memory (elastic::State; Note [Commits in memory] in in_memory.cc):
// a checkpoint of the same catalog as the files' (catalog.h), spread over the ranks and a partner
// on another node, restored at any world size and strategy.
#pragma once

#include <cstdint>
#include <vector>

#include "chorus/checkpoint.h"
#include "chorus/process_group.h"

namespace chorus::detail::checkpoint {

class MemoryCommits {
 public:
  MemoryCommits();
  ~MemoryCommits();
  // Collective over `group`: keeps this rank's part of `state` as commit `version` (and a copy of
  // its partner's shards). A failure (the group's error is rethrown) leaves the commits before it.
  void commit(const CheckpointState& state, ProcessGroup& group, int64_t version);
  // Collective over `group`, whose ranks may hold any commits or none (newcomers): loads the
  // newest commit they hold completely into `state` and returns its version. When no rank holds
  // one, rank 0's state becomes everyone's (each rank keeps its own shards) and 0 is returned.
  // Error, naming the missing ranks, when the ranks hold only incomplete commits.
  int64_t restore(const CheckpointState& state, ProcessGroup& group);
  // The bytes of tensors the commits hold on this rank.
  int64_t bytes() const;

  struct Version;  // one commit as this rank holds it (in_memory.cc)

 private:
  std::vector<Version> versions_;  // oldest first; two only between a commit's exchange and its barrier
};

}  // namespace chorus::detail::checkpoint
