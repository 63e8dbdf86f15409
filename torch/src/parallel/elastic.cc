// Note [Elastic in process]: how a worker survives a change of membership.
//
// chorusrun's agents form rounds (Note [Elastic rendezvous]). Workers inside elastic::run tell
// their agent (chorus/elastic/in_process in the round's store) that they recover in process;
// the agent then never stops them for a change: it forms the next round and writes each local
// worker's new variables into its own store (worker/<local rank>). A worker whose group failed
// (any collective raised, the communicator marked failed) restores its last commit, asks its
// agent for a new round (worker/request: the agents may not have noticed, if only a link between
// two workers broke), drops the default group, waits for its new place, sets the variables and
// initializes the default group again on the round's fresh store. Rank 0 of every group is a
// survivor (ranks keep the previous round's node order), so sync() from rank 0 gives newcomers
// the committed state and puts every survivor on the same commit. A joining node's agent starts
// new workers; they enter run() like any other and receive the state in sync().
#include "chorus/elastic.h"

#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "chorus/core/error.h"
#include "parallel/checkpoint/optimizers.h"
#include "parallel/objects/collective.h"

namespace chorus::elastic {

using detail::concat;
namespace ckpt = chorus::detail::checkpoint;

namespace {

// Leaves train() for a new group that takes in the nodes waiting (commit() throws it).
struct NewGroup {};

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// CHORUS_ELASTIC_TRACE=1: each step of a recovery, with wall-clock milliseconds, on stderr.
void trace(int rank, const char* what) {
  static const bool on = [] {
    const char* v = std::getenv("CHORUS_ELASTIC_TRACE");
    return v && *v && *v != '0';
  }();
  if (!on) return;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::fprintf(stderr, "[chorus] elastic trace: rank %d: %s at unix ms %lld\n", rank, what, (long long)ms);
}

c10::IValue copy(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().detach().clone();
  return v;
}

}  // namespace

State::State(CheckpointState items) : items_(std::move(items)) {}

c10::IValue State::snapshot() const {
  auto all = new_dict();
  for (const auto& [name, item] : items_) {
    switch (item.kind()) {
      case Stateful::Kind::Module: {
        auto d = new_dict();
        for (const auto& p : item.module()->named_parameters()) d.insert("p:" + p.key(), p.value().detach().clone());
        for (const auto& b : item.module()->named_buffers()) d.insert("b:" + b.key(), b.value().detach().clone());
        all.insert(name, d);
        break;
      }
      case Stateful::Kind::Optimizer: {
        torch::optim::Optimizer& o = *item.optimizer();
        const ckpt::Codec& codec = ckpt::codec_of(o, name);
        c10::impl::GenericList options(c10::AnyType::get()), states(c10::AnyType::get());
        for (auto& group : o.param_groups()) {
          options.push_back(codec.options(group.options()));
          for (const auto& p : group.params()) {
            auto st = o.state().find(ckpt::state_key(p));
            if (st == o.state().end()) {
              states.push_back(c10::IValue());
              continue;
            }
            auto d = new_dict();
            d.insert("step", codec.step(*st->second));
            for (auto& [tname, t] : codec.tensors(*st->second))
              if (t.defined()) d.insert("t:" + tname, t.detach().clone());
            states.push_back(d);
          }
        }
        auto d = new_dict();
        d.insert("options", options);
        d.insert("states", states);
        all.insert(name, d);
        break;
      }
      case Stateful::Kind::Value: all.insert(name, copy(item.get())); break;
    }
  }
  return all;
}

void State::apply(const c10::IValue& snapshot) {
  const auto all = snapshot.toGenericDict();
  torch::NoGradGuard no_grad;
  for (const auto& [name, item] : items_) {
    if (!all.contains(name)) throw InvalidArgument(concat("elastic::State: the commit has no item '", name, "'"));
    const c10::IValue v = all.at(name);
    switch (item.kind()) {
      case Stateful::Kind::Module: {
        const auto d = v.toGenericDict();
        auto put = [&](const std::string& key, at::Tensor t) {
          if (!d.contains(key))
            throw InvalidArgument(concat("elastic::State: the commit of '", name, "' has no ", key.substr(2)));
          t.copy_(d.at(key).toTensor());
        };
        for (const auto& p : item.module()->named_parameters()) put("p:" + p.key(), p.value());
        for (const auto& b : item.module()->named_buffers()) put("b:" + b.key(), b.value());
        break;
      }
      case Stateful::Kind::Optimizer: {
        torch::optim::Optimizer& o = *item.optimizer();
        const ckpt::Codec& codec = ckpt::codec_of(o, name);
        const auto d = v.toGenericDict();
        const auto options = d.at("options").toList();
        const auto states = d.at("states").toList();
        size_t k = 0;
        for (size_t g = 0; g < o.param_groups().size(); ++g) {
          auto& group = o.param_groups()[g];
          codec.set_options(group.options(), options.get(g).toGenericDict());
          for (const auto& p : group.params()) {
            const c10::IValue s = states.get(k++);
            void* key = ckpt::state_key(p);
            if (s.isNone()) {
              o.state().erase(key);
              continue;
            }
            std::map<std::string, at::Tensor> tensors;
            for (const auto& e : s.toGenericDict())
              if (e.key().toStringRef().rfind("t:", 0) == 0)
                tensors[e.key().toStringRef().substr(2)] = e.value().toTensor().clone();
            o.state()[key] = codec.make(tensors, s.toGenericDict().at("step").toInt());
          }
        }
        break;
      }
      case Stateful::Kind::Value: item.set(copy(v)); break;
    }
  }
}

void State::commit() {
  committed_ = snapshot();
  ++commits_;
  if (group_ && launched() && nodes_waiting(group_->communicator()) > 0) {
    request_new_round(group_->communicator());
    throw NewGroup{};
  }
}

void State::restore() {
  if (!committed_.isNone()) apply(committed_);
}

void State::sync(ProcessGroup& group, int root) {
  const c10::IValue theirs = chorus::detail::broadcast_value(
      group, root, [&] { return snapshot(); }, "elastic::State::sync");
  if (group.rank() != root) apply(theirs);
}

void run(State& state, const std::function<void(ProcessGroup&)>& train, std::chrono::milliseconds round_timeout) {
  for (bool first = true;; first = false) {
    if (!first) trace(-1, "initializing the new group");
    auto world = init_process_group();
    announce_in_process(world->communicator());
    {
      // The agents usually learn of a lost node before the ranks do (a heartbeat, against a
      // store or a socket that may take seconds to fail): when chorusrun publishes a newer round,
      // the group is failed at once, so that no rank waits on a peer that is gone. The watcher
      // holds the group and is stopped before the group is dropped.
      std::atomic<bool> watching{true};
      std::thread watcher([&watching, group = world] {
        while (watching.load()) {
          try {
            if (next_round_published()) {
              group->communicator().abort("chorusrun formed a new round: a peer was lost or nodes joined");
              return;
            }
          } catch (const Error&) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
      struct Stop {
        std::atomic<bool>& flag;
        std::thread& t;
        ~Stop() {
          flag.store(false);
          t.join();
        }
      } stop{watching, watcher};
      try {
        state.group_ = world.get();
        if (!first) trace(world->rank(), "group made; syncing the state from rank 0");
        state.sync(*world);
        if (!first) trace(world->rank(), "state synced; calling train");
        if (!first)
          for (auto& callback : state.on_reset_) callback(*world);
        train(*world);
        state.group_ = nullptr;
        return;
      } catch (const NewGroup&) {
        if (world->rank() == 0) std::fprintf(stderr, "[chorus] elastic: nodes wait to join: forming a new group\n");
      } catch (const std::exception& e) {
        state.group_ = nullptr;
        if (!world->communicator().failed()) throw;
        std::fprintf(stderr,
                     "[chorus] elastic: rank %d: the group failed (%s); back to commit %lld, waiting for a new group\n",
                     world->rank(), e.what(), (long long)state.commits());
        trace(world->rank(), "failure caught");
        state.restore();
        ask_for_new_round(e.what());
      }
    }
    state.group_ = nullptr;
    world.reset();
    destroy_process_group();
    trace(-1, "old group destroyed; waiting for the next round");
    await_next_round(round_timeout);
    trace(-1, "told the next round");
  }
}

}  // namespace chorus::elastic
