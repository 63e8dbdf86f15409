// Copies between shared memory and a user's buffer.
//
// Note [Streaming stores]: a large message's destination is not in cache, and a normal store
// first reads each line it writes (read-for-ownership), so copying n bytes out costs 3n of
// memory traffic. Non-temporal stores skip that read. They also push the data out of cache, so
// they are used only for messages larger than the caches would hold anyway; for the shared
// slots, which a peer reads next, only where rank 0 timed them faster (Note [Streaming into the
// slots]: where the peer does not share this rank's caches). An in-place all-reduce writes lines
// it has just read, which are in cache: there a normal store hits the line, while a streaming one
// must first evict it, which measured 2-3x slower (16 MiB f32, W=2), so in place writes normally.
// What the caches hold is what all the group's ranks write, not one rank's message: with a
// message of 16 MiB per rank on the 2-core Xeon VM (model 167), chorus-bench, median of 2-3
// alternating runs, streaming against normal stores (the bytes the group's ranks write into their
// outputs in one call in brackets): W=2 all_gather 3.13-3.36 against 2.98-3.05 ms (64 MiB),
// all_reduce 2.40-2.42 against 2.30-2.33 (32), broadcast 1.21-1.34 against 1.15-1.16 (16), and
// with a matmul before each call the all_gather 3.28-3.36 against 2.98-3.05; W=4 broadcast
// 1.41-1.43 against 1.24-1.33 (48), all_reduce 5.65-5.95 against 5.83-5.88 (64); but W=4 all_gather
// 11.7-14.2 against 16.4-16.5 (256), W=8 broadcast 1.47-1.48 against 1.77-1.81 (112), all_reduce
// 11.6-12.2 against 14.1-14.2 (128). So a call streams where the group writes kStreamGroupBytes.
#pragma once

#include <cstddef>

namespace chorus::shm {

// Messages at least this large (bytes per rank) stream their copies into user buffers, where the
// group's ranks write at least kStreamGroupBytes into their outputs in the call (streams_out).
constexpr size_t kStreamMinBytes = 4u << 20;
constexpr size_t kStreamGroupBytes = 96u << 20;
// Whether a call of `message` bytes per rank, whose ranks write `group_writes` bytes into their
// outputs in all, streams those copies (Note [Streaming stores]).
constexpr bool streams_out(size_t message, size_t group_writes) {
  return message >= kStreamMinBytes && group_writes >= kStreamGroupBytes;
}

// memcpy, with streaming stores when `stream` (and the CPU has AVX2). Non-overlapping buffers.
void copy_out(void* dst, const void* src, size_t n, bool stream);

}  // namespace chorus::shm
