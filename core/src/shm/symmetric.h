// Symmetric memory on the shared-memory backend (Note [Symmetric memory] in communicator.h).
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
#include <memory>
#include <mutex>
#include <vector>

#include "call.h"
#include "chorus/core/communicator.h"

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

// Runs an AllocSymmetric call on `g` (Note [Symmetric buffers]).
SymmetricMemory alloc_symmetric(ShmGroup& g, const Call& c);

}  // namespace chorus::shm
