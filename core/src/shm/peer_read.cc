#include "shm/peer_read.h"

#include <sys/uio.h>

#include <cerrno>

#include "shm/shm_group.h"

namespace chorus::shm {

namespace {
// Moves n bytes between `local` and `remote` in process `pid` with process_vm_readv or
// process_vm_writev (`move`), in as many calls as the kernel takes.
bool move_peer(decltype(&process_vm_readv) move, int pid, void* local, uintptr_t remote, size_t n) {
  auto* at = static_cast<uint8_t*>(local);
  while (n > 0) {
    iovec mine{at, n}, theirs{reinterpret_cast<void*>(remote), n};
    const ssize_t moved = move(pid, &mine, 1, &theirs, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return false;
    at += moved;
    remote += size_t(moved);
    n -= size_t(moved);
  }
  return true;
}
}  // namespace

bool read_peer(int pid, const void* remote, void* local, size_t n) {
  return move_peer(process_vm_readv, pid, local, reinterpret_cast<uintptr_t>(remote), n);
}

bool write_peer(int pid, void* remote, const void* local, size_t n) {
  return move_peer(process_vm_writev, pid, const_cast<void*>(local), reinterpret_cast<uintptr_t>(remote), n);
}

SingleCopyWindow single_copy_window(OpKind kind, int world, int cores) {
  // Measured at W=2 on the 2-core Xeon VM (2 MiB of L2 each), each call's data written just before
  // it, as training writes its tensors, single copy (reading the peers, as it did then) against the
  // slots (bench/compare.py's sizes, median us): all_gather 512 KiB 68 vs 88, 1 MiB 165 vs 215, 2
  // MiB 370 vs 455, 4 MiB 1150 vs 930 (pinning each page, no pipelining) and 128-256 KiB even; on
  // the Zen 4 VM, 64 KiB 8.6 vs 10.2 where its cores were close (Note [Streaming into the slots]).
  // Timed on their third call, as they are now, on the same VM: 16 MiB 2.71-2.96 ms vs 2.99-3.12,
  // but 64 MiB 18.6 vs 13.9, where a call's inputs and outputs no longer fit the caches and the
  // slots stream; writing into the peers, two processes alone moved a 64 MiB all_gather in
  // 19.4-22.0 ms, where chorus took 14.9 through the slots. Within the window rank 0 times them
  // against the slots, and takes them where they are faster. A rank that shares its core copies for
  // its peers as well: at W=3 and W=4 on 2 cores single copy (reading) lost at every size. Gather
  // (one reader) was even; broadcast lost at every size: its root leaves once its data is in the
  // slot, while here it waits for every reader.
  if (world > cores) return {};
  if (kind == OpKind::AllGather || kind == OpKind::AllGatherV) return {16 << 10, (64 << 20) - 1};
  return {};
}

bool PeerTargets::exchange(ShmGroup& g, const std::vector<uint8_t*>& places) {
  g_ = &g;
  const size_t world = size_t(g.world());
  // A slot holds at least a line per rank (Layout), more than the header and world addresses.
  auto* mine = reinterpret_cast<Published*>(g.write_slot());
  *mine = {g.reads_peers(), 1};
  auto* my_places = reinterpret_cast<uint64_t*>(mine + 1);
  for (size_t q = 0; q < world; ++q) my_places[q] = reinterpret_cast<uint64_t>(places[q]);
  g.sync();
  targets_.resize(world);
  bool everyone = true;
  for (size_t p = 0; p < world; ++p) {
    const auto* theirs = reinterpret_cast<const Published*>(g.read_slot(int(p)));
    everyone = everyone && theirs->can_write;
    targets_[p] = reinterpret_cast<const uint64_t*>(theirs + 1)[g.rank()];
  }
  if (!everyone) g.stop_single_copy();
  return everyone;
}

void PeerTargets::write(int p, size_t offset, const void* src, size_t n) {
  if (n == 0 || !ok_) return;  // after a failure the call runs again through the slots
  ok_ = write_peer(g_->pid_of(p), reinterpret_cast<void*>(targets_[size_t(p)] + offset), src, n);
}

bool PeerTargets::finish() {
  reinterpret_cast<Published*>(g_->write_slot())->writes_ok = ok_;
  g_->sync();
  for (int p = 0; p < g_->world(); ++p)
    if (!reinterpret_cast<const Published*>(g_->read_slot(p))->writes_ok) {
      g_->stop_single_copy();
      return false;
    }
  return true;
}

}  // namespace chorus::shm
