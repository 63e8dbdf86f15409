// Single-copy collectives on ordinary buffers: a rank reads what it needs straight from its
// peers' buffers.
//
// Note [Single-copy collectives]: through the slots, every byte that moves between two ranks is
// copied twice: by its owner into its slot, then by the receiver out of it. Linux lets a process
// read another process's memory in one copy (process_vm_readv, "cross-memory attach", which Open
// MPI's shared-memory transport uses above 4 KiB). A collective that only moves data can run a
// call in two phases instead of one per slot's worth:
//   1. exchange(): every rank publishes where its source buffer lies. Passing this phase also
//      tells each rank that its peers have entered the call, so their buffers hold the data.
//   2. Every receiving rank reads what it needs from its peers' buffers into its output.
//   3. finish(): every rank says whether its reads worked. After this phase no rank touches a
//      peer's buffer, so every rank may return.
// That saves a copy, but not the transfer between cores, which is what costs most when the data
// was just written (as a training step writes its tensors): the kernel pins each page it copies,
// the slots pipeline and the reads do not, and a rank that shares its core with a peer must do
// its peer's reads too. Where single copies may win is kept in one table, single_copy_window():
// an all_gather of 16 KiB to 64 MiB per rank (not including 64) with a core for each rank. Whether they do depends on
// the machine, and on a VM from minute to minute: on a 2-core Xeon VM they won (W=2 all_gather of
// 1 MiB: 160-173 us against 211-217 through the slots); on a 2-core Zen 5 VM process_vm_readv moved
// 9.6-10 GB/s whatever the size or page size and they lost at every size (1 MiB 165-170 against
// 95-103); on the 2-core Zen 4 VM they won in one of its states and lost in another (W=2, 1 MiB:
// 104 against 127 us through the slots where a cache line's round trip took 0.15 us, 204 against
// 109 where it took 0.52: Note [Streaming into the slots]). So, unless told, rank 0 times them
// against the slots as the job runs, as a third way of such calls, and the group takes the faster.
// CHORUS_SHM_SINGLE_COPY=1 (or CommunicatorOptions::shm.single_copy) makes every call in the
// window read its peers, and 0 none.
//
// Whether a peer's memory can be read is decided once per group that tries single copies, when it
// is made (probe_peer_reads): the kernel may refuse (Yama's ptrace_scope, seccomp), and a pid from
// another pid namespace names some other process. Each rank reads, from every peer, the random
// word the peer wrote into its own control block, at the address where that peer maps the
// segment. The read succeeds, and finds the word the segment holds, only if the pid is the
// peer's process and reading it is allowed. exchange() carries each rank's verdict, so every
// rank sees all verdicts and takes the same path; after one "no", the group stops asking. A read
// that fails during a call is reported by finish(), and then every rank runs the call again
// through the slots. CHORUS_SHM_SINGLE_COPY=0 (CommunicatorOptions::shm.single_copy) makes a
// rank say "no".
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

// The message sizes (bytes per rank) for which a collective may read its peers directly.
struct SingleCopyWindow {
  size_t min_bytes = 0, max_bytes = 0;
  bool contains(size_t bytes) const { return bytes >= min_bytes && bytes <= max_bytes; }
};
// The window of `kind` in a group of `world` ranks on `cores` cores (rank 0's count, so every rank
// gets the same window); empty where the slots were always faster.
SingleCopyWindow single_copy_window(OpKind kind, int world, int cores);

// One single-copy call's view of its peers' source buffers (Note [Single-copy collectives]).
class PeerSources {
 public:
  // Phase 1 (a sync): publishes `mine`, this rank's buffer that its peers read. True when every
  // rank can read its peers; false sends every rank down the staged path.
  bool exchange(ShmGroup& g, const void* mine);
  // Reads the first n bytes of rank p's published buffer into dst; a failure is kept for finish().
  void read(int p, void* dst, size_t n);
  // Phase 2 (a sync on exchange()'s group). True when every rank's reads worked; false sends every
  // rank down the staged path and turns single copies off for the group.
  bool finish();

 private:
  struct Published {
    uint64_t address;
    uint32_t can_read;
    uint32_t reads_ok;
  };
  std::vector<Published> peers_;
  ShmGroup* g_ = nullptr;
  bool ok_ = true;
};

}  // namespace chorus::shm
