// Which samples each rank trains on: torch.utils.data.DistributedSampler's semantics (what
// Fabric's setup_dataloaders and Accelerate install), plus a position that a checkpoint keeps,
// so that a job resumed at another world size goes on where the epoch was.
//
// Each epoch is a permutation of the dataset (shuffled by seed + epoch with torch's CPU
// generator, the order Python's DistributedSampler gives; or 0..n-1 without shuffle). Rank r of
// W takes every W-th index starting at r, the list padded by repeating its start so all ranks
// get as many (or, with drop_last, cut to a multiple of W). advance(n) records that every rank
// consumed n samples; after a resize the indices not yet consumed are dealt out again over the
// new ranks, so across the change no sample is lost or seen twice.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>

namespace chorus {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // cut the tail rather than pad it
};

class DistributedSampler {
 public:
  // Throws InvalidArgument naming a bad size, replica count or rank.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});

  // Starts `epoch` from its beginning (keeps the position when it is the current epoch).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Samples of this epoch consumed by all ranks together.
  int64_t position() const { return position_; }

  // This rank's indices for the rest of the epoch (int64), in order.
  at::Tensor indices() const;
  // Their number: the same on every rank.
  int64_t size() const;
  // Every rank consumed `per_rank` more of its indices (one step of a batch each).
  void advance(int64_t per_rank);

  // A new world: the rest of the epoch is dealt out over `num_replicas` ranks.
  void set_replicas(int num_replicas, int rank);
  int num_replicas() const { return replicas_; }
  int rank() const { return rank_; }

  // {"epoch", "position", "dataset_size", "seed", "shuffle", "drop_last"}: what a checkpoint
  // keeps (CheckpointState takes the sampler itself). Loading checks that the dataset and the
  // shuffling are the same, and throws InvalidArgument naming what differs.
  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& state);

 private:
  int64_t remaining() const { return size_ - position_; }
  int64_t size_;
  int replicas_, rank_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0, position_ = 0;
};

}  // namespace chorus
