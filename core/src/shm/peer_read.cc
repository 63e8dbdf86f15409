#include "shm/peer_read.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "shm/shm_group.h"

namespace chorus::shm {

bool read_peer(int pid, const void* remote, void* local, size_t n) {
  auto* to = static_cast<uint8_t*>(local);
  auto from = reinterpret_cast<uintptr_t>(remote);
  while (n > 0) {
    iovec mine{to, n}, theirs{reinterpret_cast<void*>(from), n};
    const ssize_t got = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    to += got;
    from += size_t(got);
    n -= size_t(got);
  }
  return true;
}

SingleCopyWindow single_copy_window(OpKind kind, int world, int cores) {
  // Measured at W=2 on the 2-core Xeon VM (2 MiB of L2 each), each call's data written just before it, as
  // training writes its tensors, single copy against the slots (bench/compare.py's sizes, median
  // us): all_gather 512 KiB 68 vs 88, 1 MiB 165 vs 215, 2 MiB 370 vs 455, 4 MiB 1150 vs 930
  // (pinning each page, no pipelining) and 128-256 KiB even; on the Zen 4 VM, 64 KiB 8.6 vs 10.2
  // where its cores were close (Note [Streaming into the slots]). Timed on their third call, as
  // they are now, on the same VM: 16 MiB 2.71-2.96 ms vs 2.99-3.12, but 64 MiB 18.6 vs 13.9,
  // where a call's inputs and outputs no longer fit the caches and the slots stream. Within the
  // window rank 0 times them against the slots, and takes them where they are faster. A rank that
  // shares its core reads for its peers as well: at W=3 and W=4 on 2 cores single copy lost at
  // every size. Gather (one reader) was even; broadcast lost at every size: its root leaves once
  // its data is in the slot, while here it waits for every reader.
  if (world > cores) return {};
  if (kind == OpKind::AllGather || kind == OpKind::AllGatherV) return {16 << 10, (64 << 20) - 1};
  return {};
}

bool PeerSources::exchange(ShmGroup& g, const void* mine) {
  g_ = &g;
  static_assert(sizeof(Published) <= 64, "fits the smallest slot");
  *reinterpret_cast<Published*>(g.write_slot()) = {reinterpret_cast<uint64_t>(mine), g.reads_peers(), 1};
  g.sync();
  peers_.resize(size_t(g.world()));
  bool everyone = true;
  for (int p = 0; p < g.world(); ++p) {
    std::memcpy(&peers_[size_t(p)], g.read_slot(p), sizeof(Published));
    everyone = everyone && peers_[size_t(p)].can_read;
  }
  if (!everyone) g.stop_single_copy();
  return everyone;
}

void PeerSources::read(int p, void* dst, size_t n) {
  if (n == 0 || !ok_) return;  // after a failure the call runs again through the slots
  ok_ = read_peer(g_->pid_of(p), reinterpret_cast<const void*>(peers_[size_t(p)].address), dst, n);
}

bool PeerSources::finish() {
  reinterpret_cast<Published*>(g_->write_slot())->reads_ok = ok_;
  g_->sync();
  for (int p = 0; p < g_->world(); ++p)
    if (!reinterpret_cast<const Published*>(g_->read_slot(p))->reads_ok) {
      g_->stop_single_copy();
      return false;
    }
  return true;
}

}  // namespace chorus::shm
