// Symmetric memory on the shared-memory backend (Note [Symmetric memory] in symmetric_memory.h).
//
// Note [Symmetric buffers]: alloc_symmetric is a call like the others (checked, two phases). Each
// rank creates its buffer as a POSIX shared-memory object under a random name and writes the name
// into its slot; after the first phase every rank maps every peer's object, and after the second
// (everyone has mapped everything) each rank unlinks its own name. So nothing is left in
// /dev/shm once the call returns, and a buffer's memory lives as long as some rank maps it. A
// rank whose mapping fails throws, which aborts the group, so the others stop waiting.
//
// Allocations are numbered per group in call order, so the same allocation has the same id on
// every rank. A call publishes the ids and offsets of its buffers (SymmetricRef) and every rank
// decides from all ranks' refs alone, so they all take the same path.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "call.h"
#include "chorus/core/symmetric_memory.h"

namespace chorus::shm {

class ShmGroup;

// One allocation as this rank sees it: every rank's buffer, mapped here.
struct SymmetricRegion {
  uint32_t id = 0;
  size_t bytes = 0;             // of each rank's buffer
  std::vector<uint8_t*> bases;  // by rank
  SymmetricRegion() = default;
  SymmetricRegion(const SymmetricRegion&) = delete;
  SymmetricRegion& operator=(const SymmetricRegion&) = delete;
  ~SymmetricRegion();  // unmaps them
};

// The allocations of one group that are alive on this rank. Thread-safe: buffers are freed on
// the user's threads while calls run on the executor.
class SymmetricRegistry {
 public:
  void add(std::shared_ptr<SymmetricRegion> region);
  void remove(uint32_t id);
  // The region whose own buffer holds [p, p + n), with p's offset in it; null if none.
  std::shared_ptr<SymmetricRegion> find(int rank, const void* p, size_t n, uint64_t* offset) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<SymmetricRegion>> regions_;
};

// Where a call's buffer lies: in allocation `id` (0: not symmetric) at `offset` bytes.
struct SymmetricRef {
  uint32_t id = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;
};

// Note [Direct collectives]: when a call's buffers lie in symmetric memory on every rank, a rank
// can read or write its peers' buffers itself, and nothing needs staging through the slots. The
// call's first phase publishes where this rank's input and output lie (their SymmetricRefs, in
// the call line), and every rank decides from all ranks' refs alone, so all take the same path:
// direct when each needed buffer lies in one allocation, the same on every rank (offsets may
// differ), staged otherwise. That first phase also tells every rank that its peers entered the
// call, so their buffers are ready to be read and written; a direct algorithm ends with one more
// phase, after which nobody touches a peer's buffer again.
//
// The direct path costs a phase more than a call that fits one slot's round (one to publish
// the buffers, one to finish), and saves a copy; below kDirectMinBytes moved in all the phase
// costs more. W=2 and W=4 on 2 cores, rank 0's median (us), staged against direct: all_gather of
// 1 KiB per rank 0.52-0.56 / 0.78-0.98 and 3.9-4.0 / 6.3-7.4, 16 KiB 1.66 / 1.40-1.61 and
// 7.3-7.6 / 7.4-9.3; reduce_scatter of 4 KiB in all 0.88 / 0.89-0.94 and 5.0-5.1 / 5.5-5.9, 16 KiB
// 1.63-1.83 / 1.36-1.37 and 8.1-8.2 / 7.7-8.5. all_reduce goes direct only past its one-shot sizes.
constexpr size_t kDirectMinBytes = 16 << 10;

class DirectBuffers {
 public:
  enum Buffer { kIn = 0, kOut = 1 };
  // The call's first phase (a sync). True when, on every rank, every buffer `needed` names lies in
  // one symmetric allocation, the same allocation on every rank.
  bool exchange(ShmGroup& g, const void* in, const void* out, size_t bytes_in, size_t bytes_out,
                std::initializer_list<Buffer> needed);
  // Where buffer `b` of rank `rank` lies, mapped here (after exchange() returned true).
  uint8_t* at(int rank, Buffer b) const { return region_[b]->bases[size_t(rank)] + ref(rank, b).offset; }
  // Rank `rank` reduces in place: its input and output are one place.
  bool in_place(int rank) const {
    return region_[kIn] == region_[kOut] && ref(rank, kIn).offset == ref(rank, kOut).offset;
  }

 private:
  const SymmetricRef& ref(int rank, Buffer b) const { return refs_[2 * size_t(rank) + size_t(b)]; }
  std::shared_ptr<SymmetricRegion> region_[2];
  std::vector<SymmetricRef> refs_;  // every rank's in and out
};

// Runs an AllocSymmetric call on `g` (Note [Symmetric buffers]).
SymmetricMemory alloc_symmetric(ShmGroup& g, const Call& c);

}  // namespace chorus::shm
