// A unit: parameters gathered, freed and reduced together (FSDP2's FSDPParamGroup;
// Note [Sharded units] in state.cc). Its reductions are in backward.cc.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "parallel/sharded/param.h"

namespace chorus::detail {

class ShardedUnit {
 public:
  explicit ShardedUnit(std::string n) : name(std::move(n)) {}

  const std::string name;              // in the module; "" for the root unit
  std::vector<ShardedParam*> params;   // all of them (the state owns them)
  std::vector<ShardedParam*> reduced;  // those that get gradients, in reduction-buffer order

  void gather(ShardingContext& c) {
    for (ShardedParam* p : params) p->gather(c);
  }
  void prefetch(ShardingContext& c) {
    for (ShardedParam* p : params) p->prefetch(c);
  }
  void free(ShardingContext& c) {
    for (ShardedParam* p : params) p->free(c);
  }
  // The bytes of its full parameters when gathered.
  int64_t gathered_bytes(int world) const;

  // Backward (backward.cc). A parameter's gradient arrived.
  void note_ready(ShardedParam& p, ShardingContext& c);
  bool complete() const { return ready_ == reduced.size(); }  // every gradient arrived
  // Starts the reduce-scatters (sync) or leaves the gradients to accumulate (no_sync); FullShard
  // (`reshard`) frees the parameters. Once per backward.
  void launch_reduction(ShardingContext& c, bool sync, bool reshard);
  // Waits for each parameter's reduction and adds it to the shard's gradient; the first error is
  // kept in `error`, after which the rest are waited for and dropped.
  void finish_reduction(ShardingContext& c, std::exception_ptr& error);
  void reset_backward();

 private:
  size_t ready_ = 0;       // of `reduced`, arrived in this backward
  bool launched_ = false;  // its reduction started in this backward
};

}  // namespace chorus::detail
