// How the shared-memory engine moves data: the tuning a group is made with
// (CommunicatorOptions::shm), each unset field taken from its CHORUS_SHM_* setting (settings.h).
#pragma once

#include <cstddef>
#include <optional>

namespace chorus {

struct ShmOptions {
  // The size of a slot (up to 4 times it with more ranks than cores); 0: CHORUS_SHM_CHUNK_BYTES or
  // its default.
  size_t chunk_bytes = 0;
  // Whether shared memory reads this rank's peers' buffers directly (process_vm_readv) in
  // middle-sized all_gathers; nullopt: CHORUS_SHM_SINGLE_COPY, and if that is unset, where rank 0
  // timed that faster than the slots, lately. A "no" on any rank holds for the whole group; rank
  // 0's "yes" or "no" decides whether the group tries at all.
  std::optional<bool> single_copy;
  // Whether shared memory writes messages of 16 KiB per rank and up into its slots with streaming
  // stores, which pays where the ranks' cores do not share a cache; nullopt:
  // CHORUS_SHM_STREAM_SLOTS, and if that is unset, rank 0 times both kinds as the job runs, for
  // each kind and size of call, and uses the faster. Rank 0's setting decides for the group.
  std::optional<bool> stream_slots;

  // These options with every unset field taken from `fallback`.
  ShmOptions or_else(const ShmOptions& fallback) const {
    return {chunk_bytes ? chunk_bytes : fallback.chunk_bytes, single_copy ? single_copy : fallback.single_copy,
            stream_slots ? stream_slots : fallback.stream_slots};
  }
};

}  // namespace chorus
