// Single-copy collectives on ordinary buffers: a rank writes its block straight into its peers'
// buffers.
//
// Note [Single-copy collectives]: through the slots, every byte that moves between two ranks is
// copied twice: by its owner into its slot, then by the receiver out of it. Linux lets a process
// read and write another process's memory in one copy (process_vm_readv and process_vm_writev,
// "cross-memory attach"; Open MPI's shared-memory transport reads with it above 4 KiB). A
// collective that only moves data can run a call in two phases instead of one per slot's worth:
//   1. exchange(): every rank publishes where each rank's block goes in its output. Passing this
//      phase also tells each rank that its peers have entered the call, so their outputs may be
//      written.
//   2. Every rank writes its block into each peer's output, a piece at a time: it copies the piece
//      into its own output (streaming it there from 4 MiB, gather.cc), then writes the same piece to
//      its peers while it is in its cache.
//   3. finish(): every rank says whether its writes worked. After this phase no rank touches a
//      peer's buffer, and every rank's output holds every block, so every rank may return.
// That saves a copy, but not the transfer between cores, which is what costs most when the data
// was just written (as a training step writes its tensors): the kernel pins each page it copies,
// the slots pipeline and the writes do not, and a rank that shares its core with a peer must do
// its peer's writes too. Writing beats reading: the writer's source is in its own cache and it
// reads it once for all its copies, and stores to another core's lines need not wait as loads
// do. On the 2-core Xeon VM (model 167), W=2, alternating runs of each, median: all_gather 64 KiB
// 7.9 us reading the peers against 5.4 writing, 1 MiB 145 against 106, 16 MiB 3.12 ms against
// 2.81 (Open MPI, which reads: 12.6 us, 170 us, 3.07 ms). Where single copies may win is kept in
// one table, single_copy_window(): an all_gather of 16 KiB to 64 MiB per rank (not including 64)
// with a core for each rank. Whether they do depends on the machine, and on a VM from minute to
// minute: reading the peers, on a 2-core Xeon VM they won (W=2 all_gather of 1 MiB: 160-173 us
// against 211-217 through the slots); on a 2-core Zen 5 VM process_vm_readv moved 9.6-10 GB/s
// whatever the size or page size and they lost at every size (1 MiB 165-170 against 95-103); on
// the 2-core Zen 4 VM they won in one of its states and lost in another (W=2, 1 MiB: 104 against
// 127 us through the slots where a cache line's round trip took 0.15 us, 204 against 109 where it
// took 0.52: Note [Streaming into the slots]). So, unless told, rank 0 times them against the
// slots as the job runs, as a third way of such calls, and the group takes the faster (weighed
// from a trial against the slots in use and warm: Note [Streaming into the slots]).
// CHORUS_SHM_SINGLE_COPY=1 (or CommunicatorOptions::shm.single_copy) makes every call in the
// window write into its peers, and 0 none.
//
// Whether a peer's memory can be reached is decided once per group that tries single copies, when
// it is made (probe_peer_reads): the kernel may refuse (Yama's ptrace_scope, seccomp), and a pid
// from another pid namespace names some other process. Each rank reads, from every peer, the
// random word the peer wrote into its own control block, at the address where that peer maps the
// segment. The read succeeds, and finds the word the segment holds, only if the pid is the peer's
// process and the kernel lets this rank reach its memory (a write asks the same permission).
// exchange() carries each rank's verdict, so every rank sees all verdicts and takes the same
// path; after one "no", the group stops asking. A write that fails during a call is reported by
// finish(), and then every rank runs the call again through the slots. CHORUS_SHM_SINGLE_COPY=0
// (CommunicatorOptions::shm.single_copy) makes a rank say "no".
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "call.h"

namespace chorus::shm {

class ShmGroup;

// Rank 0's setting of single copies for its group (Header::single_copy).
enum SingleCopyMode : uint32_t { kSingleCopyNever = 0, kSingleCopyAlways = 1, kSingleCopyTimed = 2 };

// Copies n bytes at `remote` in process `pid` into `local`. False when the kernel refuses or
// `remote` is not mapped there. Never throws.
bool read_peer(int pid, const void* remote, void* local, size_t n);

// The message sizes (bytes per rank) for which a collective may reach its peers' buffers directly.
struct SingleCopyWindow {
  size_t min_bytes = 0, max_bytes = 0;
  bool contains(size_t bytes) const { return bytes >= min_bytes && bytes <= max_bytes; }
};
// The window of `kind` in a group of `world` ranks on `cores` cores (rank 0's count, so every rank
// gets the same window); empty where the slots were always faster.
SingleCopyWindow single_copy_window(OpKind kind, int world, int cores);

// Copies n bytes at `local` into `remote` in process `pid`. False when the kernel refuses or
// `remote` is not mapped there. Never throws.
bool write_peer(int pid, void* remote, const void* local, size_t n);

// One single-copy call's view of where its peers' outputs take this rank's block (Note
// [Single-copy collectives]).
class PeerTargets {
 public:
  // Phase 1 (a sync): publishes places[q], where rank q's block goes in this rank's output, for
  // every rank q. True when every rank can write into its peers; false sends every rank down the
  // staged path.
  bool exchange(ShmGroup& g, const std::vector<uint8_t*>& places);
  // Writes n bytes at src into rank p's output, `offset` bytes into the place of this rank's
  // block; a failure is kept for finish().
  void write(int p, size_t offset, const void* src, size_t n);
  // Phase 2 (a sync on exchange()'s group): after it every rank's output holds every block. True
  // when every rank's writes worked; false sends every rank down the staged path and turns single
  // copies off for the group.
  bool finish();

 private:
  struct Published {  // in the rank's slot, followed by the world addresses of exchange()
    uint32_t can_write;
    uint32_t writes_ok;
  };
  static_assert(sizeof(Published) == 8, "the addresses that follow stay aligned");
  std::vector<uint64_t> targets_;  // where this rank's block goes in each rank's output
  ShmGroup* g_ = nullptr;
  bool ok_ = true;
};

}  // namespace chorus::shm
