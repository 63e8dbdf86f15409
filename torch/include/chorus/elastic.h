// In-process recovery for elastic jobs (chorusrun --nnodes MIN:MAX), in the spirit of Horovod
// Elastic: the training loop runs inside elastic::run(state, train); state.commit() at step
// boundaries keeps a copy of the model, the optimizer and the values in memory. When a peer
// fails, the survivors' calls raise (PeerFailure) as always; the survivors form a new group without
// the lost ranks in the same processes (chorusrun tells each its new rank), put the last commit
// back and call train again. A node that joins gets the state from the live peers' memory, not
// from disk.
//
// Replicated (DDP, made again inside train for every group):
//   torch::nn::Sequential model(...);
//   torch::optim::SGD opt(model->parameters(), ...);
//   int64_t step = 0;
//   chorus::DistributedSampler sampler(n, 1, 0);
//   chorus::elastic::State state{{"model", model}, {"optimizer", opt}, {"step", step}, {"sampler", sampler}};
//   chorus::elastic::run(state, [&](chorus::ProcessGroup& world) {
//     chorus::DistributedDataParallel ddp(model.ptr());
//     sampler.set_replicas(world.size(), world.rank());
//     for (...) { ...; ++step; if (step % 10 == 0) state.commit(); }
//   });
// Sharded (FullShard, ShardGradOp: made once, over the default group, before run; run moves it
// onto each new group, resharding the parameters and the optimizer state in memory):
//   chorus::init_process_group();
//   chorus::ShardedDataParallel sdp(model);
//   torch::optim::SGD opt(sdp.parameters(), ...);
//   chorus::elastic::State state{{"model", sdp}, {"optimizer", opt}, {"step", step}, {"sampler", sampler}};
//   chorus::elastic::run(state, [&](chorus::ProcessGroup& world) { ... sdp.forward(...) ... });
//
// Memory (Note [Commits in memory]): each rank keeps one copy of the replicated state, and its own
// shards twice (its own copy, and its partner's: a rank on another node keeps it too, so losing
// one node loses no shard); from a commit's start to its end, the previous commit as well.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>

#include "chorus/checkpoint.h"
#include "chorus/core/elastic.h"
#include "chorus/process_group.h"

namespace chorus::detail::checkpoint {
class MemoryCommits;
}

namespace chorus::elastic {

class State {
 public:
  // The items (by reference, as for checkpoints): modules, optimizers, values, samplers.
  explicit State(CheckpointState items);
  State(std::initializer_list<std::pair<std::string, Stateful>> items) : State(CheckpointState(items)) {}

  // Collective over the group run() gave train (outside run: the default group): keeps a copy of
  // every item in memory, its shards also on a partner. In an elastic job, also asks whether nodes
  // wait to join: if so, leaves train for a new group that takes them in (run() catches it).
  // InvalidArgument for a sharded module made over another group.
  void commit();
  // Collective: puts the newest commit the group holds back. Without any: rank 0's state becomes
  // everyone's.
  void restore();
  // The commit the items are at (commits count up across groups; run() commits at each start).
  int64_t commits() const { return commits_; }
  // The bytes the commits hold on this rank.
  int64_t memory_bytes() const;
  // Called after each new group is formed, before train (say, to scale the learning rate).
  void on_reset(std::function<void(ProcessGroup&)> callback) { on_reset_.push_back(std::move(callback)); }

 private:
  friend void run(State&, const std::function<void(ProcessGroup&)>&, std::chrono::milliseconds);
  ProcessGroup& group() const;
  CheckpointState items_;
  std::shared_ptr<detail::checkpoint::MemoryCommits> memory_;
  int64_t commits_ = 0;
  ProcessGroup* group_ = nullptr;  // while run() runs train
  std::vector<std::function<void(ProcessGroup&)>> on_reset_;
};

// Runs train(world) on the default group (initializing it), and again on each new group after a
// peer failed or nodes joined (state.commit() left for them). Before each call it moves the
// state's sharded modules onto the group, restores the newest commit (on the first group: rank
// 0's state) and commits. Returns when train returns. Errors that do not come from a failed group, and a new group that does not
// come within `round_timeout`, are rethrown.
void run(State& state, const std::function<void(ProcessGroup&)>& train,
         std::chrono::milliseconds round_timeout = std::chrono::minutes(10));

}  // namespace chorus::elastic
