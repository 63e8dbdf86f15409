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
// What the caches must hold is what the whole call touches, every rank's input and output, not
// one rank's message. With a message of 16 MiB per rank on the 2-core Xeon VM (model 167),
// chorus-bench, median of 2-3 alternating runs, streaming against normal stores (the bytes of the
// group's inputs and outputs in brackets): W=2 all_gather 3.13-3.36 against 2.98-3.05 ms (96 MiB),
// all_reduce 2.40-2.42 against 2.30-2.33 (64), broadcast 1.21-1.34 against 1.15-1.16 (32), and with
// a matmul before each call the all_gather 3.28-3.36 against 2.98-3.05; W=4 broadcast 1.41-1.43
// against 1.24-1.33 (64); but W=4 all_reduce 5.57-5.78 against 5.73-7.50 (128; beside a CPU-bound
// process 10.7-10.8 against 11.1-13.0), W=4 all_gather 11.7-14.2 against 16.4-16.5 (320), W=8
// broadcast 1.47-1.48 against 1.77-1.81 (128), all_reduce 11.6-12.2 against 14.1-14.2 (256). So a
// call streams where it touches kStreamGroupBytes, between what these caches held (96 MiB) and what
// they did not (128). The CPU cannot say where that lies: a VM reports its host's last-level cache
// (480 MiB on that VM), shared with its other tenants. But where it reports a small one, the
// caches hold less: on the 2-core Zen 4 VM (model 17, 32 MiB of L3, which that VM reports as it
// is), W=2, 16 MiB all_gather (96 MiB), streaming against normal copies out, alternating rounds
// of chorus-bench: 3.82 against 4.10 ms with normal stores into the slots (8 rounds), 4.22 against
// 4.90 with rank 0's choice of them (16 rounds; 3.80 against 3.81 in 8 more); all_reduce (64 MiB)
// 3.29 against 3.51 (10), but W=4 broadcast (64 MiB) 2.07 against 1.70 (10; 2.08 against 1.76 in
// 10 more). So a call also streams where it touches kStreamLastLevel times the last-level cache
// the CPU reports, between the 64 and 96 MiB of that VM (stream_group_bytes).
//
// Note [Streaming out with the slots]: what the caches hold for a call is not fixed either. The
// host's other tenants share that 480 MiB, and in the Xeon VM's slow spells of memory the rule
// above cost W=2's 16 MiB calls what b609d2a's (streaming out from 4 MiB a rank) did not:
// chorus-bench, alternating rounds on 2026-12-06, all_reduce 3.35 against 3.03 ms and all_gather
// 4.83 against 3.96 (12 rounds); a build at each commit between them put the all_gather's loss at
// this rule (afd3804: 0.98 of b609d2a's speed before, 0.81 after). Copies out forced to stream
// there (the rule at 32 MiB, 8 rounds): all_reduce 3.08 ms, all_gather 3.99, b609d2a 3.09 and
// 3.92; but the broadcast 1.49 against 1.34 with normal stores. Nor do copies out go with the
// stores into the slots: streaming both, the all_reduce took 3.81-3.86 ms, where normal stores
// into the slots (whose lines the peer's cache takes) and streaming ones out were the fastest.
// So where the rule leaves a call of kStreamMinBytes or more a rank to normal stores out, rank 0
// times a fourth way beside the others (Note [Streaming into the slots]): normal stores into the
// slots, streaming ones out (Way::kStreamOut, SlotStores::stream_out()). In place, an all_reduce
// copies out normally whatever the way. The same session, 8 alternating rounds against b609d2a and
// the build before (f43e210): all_reduce 3.60 ms against 3.19 and 3.81, all_gather 4.33 against
// 4.04 and 5.26, broadcast 1.49 against 1.63 and 1.37: 16 MiB takes a few calls of each way to
// choose, within chorus-bench's 20. Over 200 calls (6 rounds) against b609d2a: all_reduce 2.82
// against 2.78 ms, all_gather 3.67 against 3.68, broadcast 1.26 against 1.51.
// Which stores are best into the slots and which out of them is not one question, though: on the
// 2-core Zen 3 VM (family 25 model 1, 32 MiB of L3 reported: a W=2 16 MiB all_reduce, 64 MiB of
// buffers, copies out normally by the rule), in the state where its vCPUs share no cache (barrier
// 0.31-0.41 us), rank 0 timed that all_reduce at 4.6-6.4 ms with normal stores both ways, 2.6-3.1
// streaming into the slots, 4.5-6.5 streaming out, and took the second at 2.6-3.1 ms, where
// b609d2a (streaming out from 4 MiB a rank, its stores into the slots timed) took 1.8-2.1. Streaming
// both ways took 2.0-2.2. So that is a fifth way (Way::kStreamBoth), timed after the fourth: 40
// alternating rounds of chorus-bench split by each round's barrier, in that state 2.16 ms against
// 2.97 without it and b609d2a's 2.20, in the VM's other state 2.24 against 2.27 and 2.26, where
// rank 0 took normal stores into the slots and streaming ones out (2.1-2.6 ms; streaming both
// 3.0-3.5).
#pragma once

#include <cstddef>

namespace chorus::shm {

// Messages at least this large (bytes per rank) stream their copies into user buffers, where the
// call touches at least stream_group_bytes() of the group's inputs and outputs (streams_out):
// kStreamGroupBytes, or kStreamLastLevel times the last-level cache the CPU reports if less.
constexpr size_t kStreamMinBytes = 4u << 20;
constexpr size_t kStreamGroupBytes = 112u << 20;
constexpr double kStreamLastLevel = 2.5;
// The group bytes from which calls stream their copies out, on a CPU that reports a last-level
// cache of `last_level` bytes (0: none reported).
size_t stream_group_bytes(size_t last_level);
// The same on this machine (its first CPU's largest cache, from sysfs).
size_t stream_group_bytes();
// Whether a call of `message` bytes per rank, whose group's inputs and outputs hold `group_bytes`
// in all, streams its copies into user buffers (Note [Streaming stores]).
inline bool streams_out(size_t message, size_t group_bytes) {
  return message >= kStreamMinBytes && group_bytes >= stream_group_bytes();
}

// memcpy, with streaming stores when `stream` (and the CPU has AVX2). Non-overlapping buffers.
void copy_out(void* dst, const void* src, size_t n, bool stream);

}  // namespace chorus::shm
