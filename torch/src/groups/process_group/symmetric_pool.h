// Tensors carved out of a group's symmetric memory: one arena (a single allocation, first fit
// over its free ranges), and the pool of arenas behind ProcessGroup::take_symmetric.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "chorus/core/communicator.h"

namespace chorus::detail {

// Collective over comm: `numel` elements of symmetric memory (Communicator::alloc_symmetric) as a
// tensor that keeps the memory alive (ProcessGroup::alloc_symmetric).
at::Tensor symmetric_tensor(Communicator& comm, int64_t numel, const at::TensorOptions& options);

// Note [Symmetric arenas]: a tensor taken from an arena is a range of one symmetric allocation,
// found first fit; the range comes back when the tensor's last reference goes, on whatever thread
// that is. When each rank's last reference goes depends on timing (an asynchronous collective
// may hold one a moment longer), so ranks may place the same buffer differently, or one may find
// no room where another does. That is never wrong: a collective runs direct only when every rank's
// buffer lies in the same allocation (Note [Direct collectives]), and staged otherwise.
class SymmetricArena : public std::enable_shared_from_this<SymmetricArena> {
 public:
  // `memory`: bytes, in symmetric memory; the tensors taken keep it alive.
  explicit SymmetricArena(at::Tensor memory);
  // A tensor of `numel` elements, 64-byte aligned, contents unspecified; undefined when no free
  // range holds it.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  // The bytes such a tensor occupies in an arena.
  static int64_t footprint(int64_t numel, const at::TensorOptions& options);

 private:
  void give_back(int64_t at, int64_t bytes);

  at::Tensor memory_;
  std::mutex mu_;
  std::map<int64_t, int64_t> free_;  // offset -> bytes
};

// Note [Symmetric pool]: ProcessGroup::take_symmetric takes from the group's arenas (collective
// over its communicator). Whether an
// arena has room is a rank's own view (Note [Symmetric arenas]), so the ranks agree on it first
// (one all_reduce of one integer): when every rank found room, each uses what it found; when any
// did not, all make a new arena together, large enough for the request and at least
// kArenaBytes, and take from it. So every rank makes the same allocations in the same order,
// whatever its timing, and memory freed by dropping a tensor serves later calls without
// allocating again. Arenas are kept while the group lives.
class SymmetricPool {
 public:
  static constexpr int64_t kArenaBytes = 8 << 20;
  at::Tensor take(Communicator& comm, int64_t numel, const at::TensorOptions& options);

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<SymmetricArena>> arenas_;
};

}  // namespace chorus::detail
