// In-process recovery for elastic jobs (chorusrun --nnodes MIN:MAX), in the spirit of Horovod
// Elastic: the training loop runs inside elastic::run(state, train); state.commit() at step
// boundaries keeps a copy of the model, the optimizer and the values in memory. When a peer
// fails, the survivors' calls raise (PeerFailure) as always; run() then puts the last commit
// back, the survivors form a new group without the lost ranks in the same processes (chorusrun
// tells each its new rank), and train is called again. A node that joins gets the state from a
// live peer (rank 0 of the new group), not from disk.
//
//   torch::nn::Sequential model(...);                       // plain modules and optimizer
//   torch::optim::SGD opt(model->parameters(), ...);
//   int64_t step = 0;
//   chorus::DistributedSampler sampler(n, 1, 0);
//   chorus::elastic::State state{{"model", model}, {"optimizer", opt}, {"step", step}, {"sampler", sampler}};
//   chorus::elastic::run(state, [&](chorus::ProcessGroup& world) {
//     chorus::DistributedDataParallel ddp(model.ptr());     // made again for every group
//     sampler.set_replicas(world.size(), world.rank());
//     for (...) { ...; ++step; if (step % 10 == 0) state.commit(); }
//   });
//
// Memory: one more copy of what the state holds (for a replicated model: its parameters,
// buffers and optimizer state), made at each commit. The model must be replicated (DDP or
// none); sharded modules are not supported here (their shards would be lost with a host).
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>

#include "chorus/checkpoint.h"
#include "chorus/core/elastic.h"
#include "chorus/process_group.h"

namespace chorus::elastic {

class State {
 public:
  // The items (by reference, as for checkpoints): modules, optimizers, values, samplers.
  explicit State(CheckpointState items);
  State(std::initializer_list<std::pair<std::string, Stateful>> items) : State(CheckpointState(items)) {}

  // Keeps a copy of every item in memory. In an elastic job, also asks whether nodes wait to
  // join (collective over the group run() gave train): if so, leaves train for a new group that
  // takes them in (run() catches it).
  void commit();
  // Puts the last commit back (the items as they were when it was made). Without one: nothing.
  void restore();
  // Collective: every rank's items become `root`'s.
  void sync(ProcessGroup& group, int root = 0);
  // How many commits were made in this process.
  int64_t commits() const { return commits_; }
  // Called after each new group is formed, before train (say, to scale the learning rate).
  void on_reset(std::function<void(ProcessGroup&)> callback) { on_reset_.push_back(std::move(callback)); }

 private:
  friend void run(State&, const std::function<void(ProcessGroup&)>&, std::chrono::milliseconds);
  c10::IValue snapshot() const;
  void apply(const c10::IValue& snapshot);
  CheckpointState items_;
  c10::IValue committed_;
  int64_t commits_ = 0;
  ProcessGroup* group_ = nullptr;  // while run() runs train
  std::vector<std::function<void(ProcessGroup&)>> on_reset_;
};

// Runs train(world) on the default group (initializing it), and again on each new group after a
// peer failed (the last commit restored) or nodes joined (state.commit() left for them). Returns
// when train returns. Errors that do not come from a failed group, and a new group that does not
// come within `round_timeout`, are rethrown.
void run(State& state, const std::function<void(ProcessGroup&)>& train,
         std::chrono::milliseconds round_timeout = std::chrono::minutes(10));

}  // namespace chorus::elastic
