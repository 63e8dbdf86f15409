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
#pragma once

#include <cstddef>

namespace chorus::shm {

// Messages at least this large (bytes per rank) stream their copies into user buffers.
constexpr size_t kStreamMinBytes = 4u << 20;

// memcpy, with streaming stores when `stream` (and the CPU has AVX2). Non-overlapping buffers.
void copy_out(void* dst, const void* src, size_t n, bool stream);

}  // namespace chorus::shm
