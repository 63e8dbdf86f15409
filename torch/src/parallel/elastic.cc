// Note [Elastic in process]: how a worker survives a change of membership.
//
// chorusrun's agents form rounds (Note [Elastic rendezvous]). Workers inside elastic::run tell
// their agent (chorus/elastic/in_process in its own store, and rank 0 in the round's) that they
// recover in process; the agent then never stops them for a change: it forms the next round and
// writes each local worker's new variables into its own store (worker/<local rank>). A worker
// whose group failed (any collective raised, the communicator marked failed) asks its agent for a
// new round (worker/request: the agents may not have noticed, if only a link between two workers
// broke), drops the default group, waits for its new place, sets the variables and initializes the
// default group again on the round's fresh store. Then, on every group: the state's sharded
// modules are moved onto it (ShardedState::regroup: same tensors, new shard sizes), the newest
// commit the group's ranks hold completely is put back (Note [Commits in memory]: survivors
// supply it, from their own copies or their partners'; newcomers receive it) and a commit is made
// at once, so that the new group's layout is protected before its first step. A joining node's
// agent starts new workers; they enter run() like any other and receive the state in restore().
// A round can be overtaken while its workers meet: two agents that noticed a loss each propose,
// one's workers take the first round, the other's only the second. The agent that served the
// first ends its rendezvous when it moves on (abort_rendezvous), and a worker whose new group did
// not form goes to the next round as after a failed one: none waits for ranks that went ahead.
#include "chorus/elastic.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "chorus/core/error.h"
#include "groups/placement.h"
#include "parallel/checkpoint/in_memory.h"
#include "parallel/sharded/state.h"

namespace chorus::elastic {

using detail::concat;

namespace {

// Leaves train() for a new group that takes in the nodes waiting (commit() throws it).
struct NewGroup {};

// CHORUS_ELASTIC_TRACE=1: each step of a recovery, with wall-clock milliseconds, on stderr.
void trace(int rank, const char* what) {
  if (const std::string stamp = trace_stamp(); !stamp.empty())
    std::fprintf(stderr, "[chorus] elastic trace: %srank %d: %s\n", stamp.c_str(), rank, what);
}

// The sharded modules of the state, each once, in the order they were made (Note [Joining a
// sharded job]: a joining process makes them in that order while the survivors move them).
std::vector<std::shared_ptr<detail::ShardedState>> sharded_modules(const CheckpointState& items) {
  std::vector<std::shared_ptr<detail::ShardedState>> out;
  for (const auto& [name, item] : items) {
    if (item.kind() != Stateful::Kind::Module) continue;
    for (const auto& p : item.module()->parameters(true)) {
      const detail::Placement where = detail::placement_of(p);
      if (where.kind != detail::Placement::Kind::Shard) continue;
      auto engine = detail::sharded_state_of(where);
      if (engine && std::find(out.begin(), out.end(), engine) == out.end()) out.push_back(engine);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

}  // namespace

State::State(CheckpointState items)
    : items_(std::move(items)), memory_(std::make_shared<detail::checkpoint::MemoryCommits>()) {}

ProcessGroup& State::group() const { return group_ ? *group_ : *default_group(); }

void State::commit() {
  ProcessGroup& g = group();
  for (const auto& engine : sharded_modules(items_))
    if (engine->group_ptr().get() != &g)
      throw InvalidArgument(concat("elastic::State::commit: a sharded module works over group '",
                                   engine->group().name(), "', not over the group the commit is for ('", g.name(),
                                   "'): elastic::run moves only modules sharded over the default group"));
  memory_->commit(items_, g, commits_ + 1);
  ++commits_;
  if (group_ && launched() && nodes_waiting(group_->communicator()) > 0) {
    request_new_round(group_->communicator());
    throw NewGroup{};
  }
}

void State::restore() { commits_ = memory_->restore(items_, group()); }

int64_t State::memory_bytes() const { return memory_->bytes(); }

void run(State& state, const std::function<void(ProcessGroup&)>& train, std::chrono::milliseconds round_timeout) {
  for (bool first = true;; first = false) {
    if (!first) trace(-1, "initializing the new group");
    std::shared_ptr<ProcessGroup> world;
    try {
      world = init_process_group();
    } catch (const Error& e) {
      // A later group that did not form: its round was overtaken while the ranks met, or one of
      // them was lost meanwhile. On to the next round, as after a failed group.
      if (first) throw;
      std::fprintf(stderr,
                   "[chorus] elastic: the new group did not form (%s); at commit %lld, waiting for the next round\n",
                   e.what(), (long long)state.commits());
      ask_for_new_round(e.what());
      await_next_round(round_timeout);
      continue;
    }
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
              trace(group->rank(), "a newer round is published: failing the group");
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
        for (const auto& engine : sharded_modules(state.items_))
          if (engine->group_ptr() != world) engine->regroup(world);
        if (!first) trace(world->rank(), "group made; restoring the last commit");
        state.restore();
        state.commit();
        if (!first) trace(world->rank(), "commit restored and made again; calling train");
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
                     "[chorus] elastic: rank %d: the group failed (%s); at commit %lld, waiting for a new group\n",
                     world->rank(), e.what(), (long long)state.commits());
        trace(world->rank(), "failure caught");
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
