// Checkpoints: save and load the training state (modules, optimizers, any values, every rank's RNG)
// in Lightning Fabric's shape, for plain modules, DDP and sharded data parallel alike
// (docs/api.md, "Checkpoints").
//
//   int64_t step = 0;
//   chorus::CheckpointState state{{"model", sdp}, {"optimizer", opt}, {"step", step}};
//   fabric.save("ckpt/step-100", state);            // collective
//   auto rest = fabric.load("ckpt/step-100", state); // restores in place, at any world size
//
// Two formats. Full: one file, written by rank 0 (sharded parameters gathered one at a time, so
// rank 0 holds its shards and one parameter more), in the zip layout of torch.save:
// torch::pickle_load (C++) and torch.load (Python) read it as a dict {item: value}, modules as
// {parameter name: tensor}. Sharded: a directory in which every rank writes its own shards in
// parallel, plus one metadata file written last; it loads at any world size and strategy.
// Both are written under temporary names, fsynced, and made visible by one rename: a crash during a
// save leaves the previous checkpoint as it was. Every tensor's bytes carry a checksum.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/ddp.h"
#include "chorus/process_group.h"
#include "chorus/sharded.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

// One thing a checkpoint holds, by reference: load restores it in place.
class Stateful {
 public:
  enum class Kind { Module, Optimizer, Value };
  // A module: its parameters and buffers. A module wrapped by DistributedDataParallel or
  // ShardedDataParallel is recognised as such (passing the module or the wrapper is the same).
  Stateful(std::shared_ptr<torch::nn::Module> module)  // NOLINT: implicit, for {"name", x} lists
      : kind_(Kind::Module), module_(std::move(module)) {
    if (!module_) throw InvalidArgument("CheckpointState: a module is null");
  }
  template <class M>
  requires std::is_base_of_v<torch::nn::Module, M> Stateful(std::shared_ptr<M> module)
      : Stateful(std::static_pointer_cast<torch::nn::Module>(std::move(module))) {}  // NOLINT
  template <class Holder>  // torch::nn::Linear, TORCH_MODULE(...)
  requires requires(Holder h) { h.ptr(); }
  Stateful(Holder& module) : Stateful(std::static_pointer_cast<torch::nn::Module>(module.ptr())) {}  // NOLINT
  Stateful(DistributedDataParallel& ddp) : Stateful(ddp.module_ptr()) {}                             // NOLINT
  Stateful(ShardedDataParallel& sdp) : Stateful(sdp.module_ptr()) {}                                 // NOLINT
  // An optimizer (SGD, Adam, AdamW, Adagrad, RMSprop): each group's options and every
  // parameter's state, named after the parameters of the modules in the same checkpoint state.
  Stateful(torch::optim::Optimizer& optimizer) : kind_(Kind::Optimizer), optimizer_(&optimizer) {}  // NOLINT
  // Values (c10::IValue, at::Tensor, int64_t, double, bool, std::string): rank 0's is saved; load
  // sets it on every rank.
  template <class T>
  requires(std::is_same_v<T, c10::IValue> || std::is_same_v<T, at::Tensor> || std::is_same_v<T, int64_t> ||
           std::is_same_v<T, double> || std::is_same_v<T, bool> || std::is_same_v<T, std::string>)
      Stateful(T& value)  // NOLINT
      : kind_(Kind::Value),
        get_([&value] { return c10::IValue(value); }),
        set_([&value](const c10::IValue& v) { value = v.to<T>(); }) {}

  // Anything with state_dict() -> IValue and load_state_dict(IValue) (DistributedSampler): its
  // state is saved as a value.
  template <class T>
  requires requires(T& t, const c10::IValue& v) {
    { t.state_dict() } -> std::convertible_to<c10::IValue>;
    t.load_state_dict(v);
  }
  Stateful(T& stateful)  // NOLINT
      : kind_(Kind::Value),
        get_([&stateful] { return c10::IValue(stateful.state_dict()); }),
        set_([&stateful](const c10::IValue& v) { stateful.load_state_dict(v); }) {}

  Kind kind() const { return kind_; }
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  torch::optim::Optimizer* optimizer() const { return optimizer_; }
  c10::IValue get() const { return get_(); }
  void set(const c10::IValue& v) const { set_(v); }

 private:
  Kind kind_;
  std::shared_ptr<torch::nn::Module> module_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  std::function<c10::IValue()> get_;
  std::function<void(const c10::IValue&)> set_;
};

// Names (no '/') to things; the order is kept.
using CheckpointState = std::vector<std::pair<std::string, Stateful>>;

enum class CheckpointFormat {
  Auto,     // Sharded when a module in the state is sharded (FullShard, ShardGradOp), else Full
  Full,     // one file
  Sharded,  // a directory: one file per rank and a metadata file
};

struct SaveOptions {
  CheckpointFormat format = CheckpointFormat::Auto;
  std::shared_ptr<ProcessGroup> group = nullptr;  // default: the default group
};

struct LoadOptions {
  // Every module parameter, buffer and optimizer state of `state` must be in the checkpoint and
  // the checkpoint's items in `state` must hold nothing else; false: load what matches.
  bool strict = true;
  std::shared_ptr<ProcessGroup> group = nullptr;
};

// Collective over the group. Throws (on every rank, naming what went wrong and where) when a rank
// fails to write; the previous checkpoint at `path` is then untouched.
void save_checkpoint(const std::string& path, const CheckpointState& state, SaveOptions options = {});

// Collective over the group. Restores every item of `state` in place (module values, optimizer
// state, values; every rank's RNG when the world size is the one that saved) and returns the
// checkpoint's other items (modules as {name: tensor}, optimizers as their state dicts).
// InvalidArgument on every rank, naming the file and what is wrong, for a checkpoint that is
// missing, truncated, corrupted, from another model, or without a rank's shards.
c10::impl::GenericDict load_checkpoint(const std::string& path, const CheckpointState& state = {},
                                       LoadOptions options = {});

// What a checkpoint says of itself (collective-free, any rank): format, world size, strategies,
// chorus version, items, tensors with shapes and dtypes, as readable text.
std::string describe_checkpoint(const std::string& path);

}  // namespace chorus
