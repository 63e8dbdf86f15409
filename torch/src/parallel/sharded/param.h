// One sharded parameter and what it shares with the others of its module: the group, a cache of
// buffers and the memory ledger (FSDP2's FSDPParam; Note [Sharded units] in state.cc).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "chorus/process_group.h"
#include "groups/placement.h"
#include "groups/process_group/symmetric_pool.h"

namespace chorus::detail {

inline int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * int64_t(t.element_size()) : 0; }

// Buffers for full parameters and reductions, reused across steps (a fresh allocation of this size
// is a fresh mapping: page faults on every step). Keeps at most `limit` bytes, the newest.
//
// Note [Sharded buffers in symmetric memory]: new buffers come from an arena (Note [Symmetric
// arenas]), one allocation of the group's symmetric memory made when the module is sharded, with
// room for the two largest units gathered and every parameter's reduced block, and from the heap
// when it has no room. Every rank takes and returns the same buffers in the same order, so a
// buffer almost always lies in the arena on every rank or on none, and a gather into it or a
// reduction out of it runs direct (Note [Direct collectives]: no staging through the slots). The
// arena also keeps memory mapped across steps: a reduced block becomes the shard's .grad, which
// an optimizer's zero_grad drops every step; from the heap, its next one was a fresh mapping,
// faulted in page by page (measured: the 100.7M-parameter FullShard step at W=2 took 5-15% longer
// with the blocks on the heap). The arena is not a pool (Note [Symmetric pool]): taking from it
// costs no collective, so prefetches stay queued behind the work before them.
class BufferCache {
 public:
  void set_limit(int64_t bytes) { limit_ = bytes; }
  // Takes new buffers from `memory` (bytes, kept alive by the buffers carved from it).
  void set_arena(at::Tensor memory);
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  void give_back(at::Tensor t);
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<at::Tensor> spare_;
  int64_t bytes_ = 0, limit_ = 0;
  std::shared_ptr<SymmetricArena> arena_;
};

// The bytes of full parameters and full gradients alive, kept as they change (never recounted),
// and the peak of their sum with the reductions in flight.
struct MemoryLedger {
  int64_t full = 0, full_grad = 0, peak = 0;
  void add(int64_t full_delta, int64_t grad_delta, int64_t in_flight = 0) {
    full += full_delta;
    full_grad += grad_delta;
    peak = std::max(peak, full + full_grad + in_flight);
  }
};

// What the parameters of one ShardedDataParallel share.
struct ShardingContext {
  std::shared_ptr<ProcessGroup> group;
  int world = 1, rank = 0;
  BufferCache buffers;
  MemoryLedger memory;
};

class ShardedParam {
 public:
  // Takes `values` (every rank's the same) and keeps this rank's shard of them.
  ShardedParam(std::string name, at::Tensor param, const at::Tensor& values, size_t unit, const ShardingContext& c);
  // Elastic recovery (ShardedState::regroup): the same `shard` tensor (the leaf the optimizer
  // holds), resized to c's S for a parameter of `numel` elements; its values are zero until loaded.
  ShardedParam(std::string name, at::Tensor param, int64_t numel, at::Tensor shard, size_t unit,
               const ShardingContext& c);

  const std::string name;
  std::vector<std::string> aliases;              // a tied parameter's other names in the module
  at::Tensor param;                              // the module's tensor, now a sharded parameter (param_kernel.h)
  c10::intrusive_ptr<c10::StorageImpl> storage;  // its storage: empty, or the full values
  const int64_t numel, shard_numel;              // N and S = ceil(N / W)
  const ShardRange mine;                         // this rank's real elements of the flat parameter
  at::Tensor shard;                              // this rank's S elements (a leaf: the optimizer's)
  const size_t unit;                             // the index of its unit in the module's state

  // Gathering: the W * S gathered elements, while the storage shows the first N of them.
  bool gathered() const { return full_.defined(); }
  const at::Tensor& full() const { return full_; }
  void gather(ShardingContext& c);    // waits for a prefetch, or all-gathers now
  void prefetch(ShardingContext& c);  // starts the all-gather
  void free(ShardingContext& c);      // unless held; a prefetch in flight lands first

  // Reduction (Note [Sharded backward] in backward.cc).
  bool ready = false;                           // its gradient arrived in this backward
  void note_grad(ShardingContext& c);           // the full gradient changed: the ledger follows
  int64_t start_reduction(ShardingContext& c);  // reduce-scatters .grad (and drops it); returns the bytes in flight
  void drop_grad(ShardingContext& c);           // drops .grad without reducing it
  // Waits for the reduction and adds its mean to the shard's .grad; throws its error.
  void finish_reduction(ShardingContext& c);
  // Waits for and forgets a reduction whose backward failed (any error ignored).
  void abandon_reduction(ShardingContext& c);
  bool reducing() const { return reduction_ != nullptr; }

  // Holding (GatheredParameters): gathered, and left alone by forward's freeing.
  bool held = false;
  int64_t version_at_hold = 0;
  int64_t version() const;

 private:
  at::Tensor full_;
  at::Tensor incoming_;                    // where a prefetch in flight lands
  std::shared_ptr<TensorWork> gathering_;  // that prefetch
  at::Tensor reduce_in_, reduce_out_;      // this backward's reduction: padded full gradient (when copied), block
  std::shared_ptr<TensorWork> reduction_;
  int64_t counted_grad_ = 0;  // the bytes of .grad the ledger holds for it
};

}  // namespace chorus::detail
