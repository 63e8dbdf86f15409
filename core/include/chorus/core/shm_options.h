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
  // Whether shared memory writes into this rank's peers' buffers directly (process_vm_writev) in
  // middle-sized all_gathers; nullopt: CHORUS_SHM_SINGLE_COPY, and if that is unset, where rank 0
  // timed that faster than the slots, lately. A "no" on any rank holds for the whole group; rank
  // 0's "yes" or "no" decides whether the group tries at all.
  std::optional<bool> single_copy;
  // Whether shared memory writes messages of 16 KiB per rank and up into its slots with streaming
  // stores, which pays where the ranks' cores do not share a cache; nullopt:
  // CHORUS_SHM_STREAM_SLOTS, and if that is unset, rank 0 times both kinds as the job runs, for
  // each kind and size of call, and uses the faster. Rank 0's setting decides for the group.
  std::optional<bool> stream_slots;
  // Shared memory a broadcast larger than the slots may stage its message in, reserved for the
  // group's life by its first such broadcast, so that its root need not wait for its readers (0:
  // none); nullopt: CHORUS_SHM_STAGE_BYTES or its default. Rank 0's value holds for the group.
  std::optional<size_t> stage_bytes;

  // These options with every unset field taken from `fallback`.
  ShmOptions or_else(const ShmOptions& fallback) const {
    return {chunk_bytes ? chunk_bytes : fallback.chunk_bytes, single_copy ? single_copy : fallback.single_copy,
            stream_slots ? stream_slots : fallback.stream_slots, stage_bytes ? stage_bytes : fallback.stage_bytes};
  }
};

}  // namespace chorus
