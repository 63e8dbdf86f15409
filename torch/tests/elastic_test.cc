// Commits in memory (Note [Commits in memory]) and sharded modules moved onto a new group (Note
// [Joining a sharded job]): a FullShard model and its Adam state put back after a node is lost,
// at another world size, from the survivors' own copies and their partners'; a newcomer gets its
// shards; losing a rank together with its partner is an error naming them. The worker side of
// elastic::run on real hosts is tests/elastic_hosts.sh; one of its races, a round overtaken while
// its ranks meet, is played here with the agents' keys written by hand.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "chorus/core/rendezvous.h"
#include "chorus/core/supervisor.h"
#include "chorus/core/tcp_store.h"
#include "groups/placement.h"
#include "parallel/checkpoint/in_memory.h"
#include "parallel/sharded/state.h"
#include "torch_harness.h"

namespace chorus::test {
namespace {

using detail::checkpoint::MemoryCommits;

// 4 ranks on two nodes of 2 (GROUP_RANK 0 and 1), as chorusrun would start them on two hosts.
void run_two_nodes(const std::function<void(RankContext&)>& body) {
  expect_all_ok(run_ranks(4, [&](RankContext& ctx) {
    for (const auto& [k, v] : launcher_environment(single_node(ctx.rank, 4, ctx.store_port, "elastic-test")))
      setenv(k.c_str(), v.c_str(), 1);
    setenv("GROUP_RANK", std::to_string(ctx.rank / 2).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(ctx.rank % 2).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    at::set_num_threads(1);
    init_process_group({.timeout = std::chrono::seconds(60)});
    body(ctx);
    destroy_process_group();
  }));
}

// A FullShard model (odd sizes: uneven shards, some padding) with Adam, over `group` (null: the
// default group), and its state as commits and checkpoints take it.
struct Trainee {
  explicit Trainee(std::shared_ptr<ProcessGroup> group = nullptr)
      : model(make()), sdp(model, {.group = std::move(group)}), opt(sdp.parameters(), 1e-2) {}
  static torch::nn::Sequential make() {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(7, 5), torch::nn::Tanh(), torch::nn::Linear(5, 3));
  }
  // `steps` Adam steps, each rank on its own batch.
  void train(int steps) {
    for (int s = 0; s < steps; ++s, ++step) {
      at::Tensor x = at::linspace(-1, 1, 4 * 7).reshape({4, 7}) * double(sdp.group().rank() + 1 + step);
      opt.zero_grad();
      sdp.forward([&] { return model->forward(x); }).pow(2).sum().backward();
      opt.step();
    }
  }
  // The full parameters, on every rank of the module's group.
  at::Tensor params() {
    GatheredParameters full({model.ptr()});
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape(-1).clone());
    return at::cat(flat);
  }
  // What elastic::run does to a sharded module on a new group.
  void move_to(const std::shared_ptr<ProcessGroup>& group) {
    detail::sharded_state_of(detail::placement_of(model->parameters()[0]))->regroup(group);
  }
  torch::nn::Sequential model;
  ShardedDataParallel sdp;
  torch::optim::Adam opt;
  int64_t step = 0;
  CheckpointState state{{"model", sdp}, {"optimizer", opt}, {"step", step}};
};

// A node's two ranks are lost after a commit (and one more step that the commit does not hold).
// The survivors move their module onto a group of their own, put the commit back and train on;
// the same training from a checkpoint on disk written at the commit must give the same bits.
TEST(MemoryCommits, ANodeLostShardsComeBackFromPartnersAtTheNewSize) {
  const std::string dir = (std::filesystem::temp_directory_path() / "chorus-elastic-test").string();
  std::filesystem::remove_all(dir);
  run_two_nodes([&](RankContext& ctx) {
    auto world = default_group();
    Trainee t;
    t.train(3);
    MemoryCommits memory;
    memory.commit(t.state, *world, 1);
    save_checkpoint(dir, t.state);
    RANK_CHECK(memory.bytes() > 0, "the commit holds nothing");
    t.train(1);  // not in the commit
    // Node 1 (ranks 2 and 3) is lost: its processes leave, the survivors hold their shards too.
    auto survivors = world->split({0, 1});
    if (ctx.rank >= 2) return;
    t.move_to(survivors);
    RANK_CHECK(t.sdp.group().size() == 2, "the module did not move to the new group");
    RANK_CHECK(memory.restore(t.state, *survivors) == 1, "not the commit made");
    RANK_CHECK(t.step == 3, "step is ", t.step, " after the restore");
    t.train(2);
    // The reference: the same two steps on a fresh module of the new size, loaded from disk.
    Trainee ref(survivors);
    load_checkpoint(dir, ref.state, {.group = survivors});
    ref.train(2);
    RANK_CHECK_EQUAL(t.params(), ref.params());
  });
  std::filesystem::remove_all(dir);
}

// A new process joins the survivors: it makes its module over the new group while they move
// theirs (the same collectives), and receives its shards and optimizer state from them.
TEST(MemoryCommits, ANewcomerReceivesItsShards) {
  run_two_nodes([&](RankContext& ctx) {
    auto world = default_group();
    auto t = std::make_unique<Trainee>();
    t->train(2);
    MemoryCommits memory;
    memory.commit(t->state, *world, 4);
    const at::Tensor want = t->params();
    // Rank 3 is lost; rank 2 starts again as a new process would, holding nothing.
    auto next = world->split({0, 1, 2});
    if (ctx.rank == 3) return;
    MemoryCommits fresh;
    if (ctx.rank == 2) {
      t.reset();
      t = std::make_unique<Trainee>(next);
    } else {
      t->move_to(next);
    }
    RANK_CHECK((ctx.rank == 2 ? fresh : memory).restore(t->state, *next) == 4, "not the commit made");
    RANK_CHECK(t->step == 2, "step is ", t->step, " after the restore");
    RANK_CHECK_EQUAL(t->params(), want);
    t->train(1);  // the optimizer state came too: one more step agrees on every rank
    at::Tensor after = t->params(), first = after.clone();
    next->broadcast_(first, 0);
    RANK_CHECK_EQUAL(after, first);
  });
}

// The group fails in the middle of a backward (as a host cut off during a step): the module is
// left inside that backward, and moving it onto the next group drops what the step had in
// flight. The commit comes back and training goes on, the same on every rank.
TEST(MemoryCommits, AGroupThatFailsDuringBackwardIsLeftForTheNext) {
  run_two_nodes([&](RankContext&) {
    auto world = default_group();
    auto next = world->split({0, 1, 2, 3});
    Trainee t;
    t.train(1);
    MemoryCommits memory;
    memory.commit(t.state, *world, 1);
    const at::Tensor want = t.params();
    at::Tensor x = at::ones({4, 7});
    at::Tensor out = t.sdp.forward([&] {
      at::Tensor hidden = t.model[0]->as<torch::nn::Linear>()->forward(x);
      hidden.register_hook([&](const at::Tensor&) { world->communicator().abort("the test cut the group off"); });
      return t.model[2]->as<torch::nn::Linear>()->forward(hidden.tanh());
    });
    bool failed = false;
    try {
      out.pow(2).sum().backward();  // the abort comes after the last layer's gradients
    } catch (const std::exception&) {
      failed = true;
    }
    RANK_CHECK(failed, "the backward did not fail");
    RANK_CHECK(t.sdp.group().communicator().failed(), "the group did not fail");
    t.move_to(next);
    RANK_CHECK(memory.restore(t.state, *next) == 1, "not the commit made");
    RANK_CHECK_EQUAL(t.params(), want);
    t.train(1);
    at::Tensor after = t.params(), first = after.clone();
    next->broadcast_(first, 0);
    RANK_CHECK_EQUAL(after, first);
  });
}

// Ranks 1 and 3 are partners (rank 1's shards are kept by 3 and the other way round): losing both
// loses their shards, which every survivor says.
TEST(MemoryCommits, LosingARankAndItsPartnerIsAnErrorNamingThem) {
  run_two_nodes([&](RankContext& ctx) {
    auto world = default_group();
    Trainee t;
    t.train(1);
    MemoryCommits memory;
    memory.commit(t.state, *world, 1);
    auto left = world->split({0, 2});
    if (ctx.rank == 1 || ctx.rank == 3) return;
    t.move_to(left);
    try {
      memory.restore(t.state, *left);
      RANK_CHECK(false, "the restore did not fail");
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(what.find("lacks the shards of its rank(s) 1, 3") != std::string::npos, "said: ", what);
      RANK_CHECK(what.find("checkpoint on disk") != std::string::npos, "said: ", what);
    }
  });
}

// The worker side of a round overtaken while its ranks met (Note [Elastic in process]): after
// the first group fails, rank 0 is told round 1 and waits there for rank 1, which is told only
// round 2 (its agent went straight to it). Process 2 plays the agents, in chorusrun's keys: it
// ends round 1's rendezvous and publishes round 2. Rank 0 leaves round 1 for round 2 instead of
// waiting out its 30-minute deadline, and the two train on in one group.
TEST(ElasticRun, AWorkerWhoseRoundWasOvertakenGoesOnToTheNext) {
  auto place = [](int rank, int round, int port) {
    Environment e = single_node(rank, 2, port, "overtaken");
    e.restart_count = round;
    return e;
  };
  auto published = [&](int rank, int round, int port) {  // what chorusrun writes in worker/<local rank>
    std::string text = std::to_string(round) + "\n";
    for (const auto& [k, v] : launcher_environment(place(rank, round, port))) text += k + "=" + v + "\n";
    return text;
  };
  expect_all_ok(run_ranks(
      3,
      [&](RankContext& ctx) {
        const int port = ctx.store_port;
        if (ctx.rank == 2) {
          auto agents = std::make_shared<TcpStore>("127.0.0.1", port);
          agents->wait({"worker/request"}, std::chrono::seconds(60));  // the first group failed
          agents->set("worker/0", published(0, 1, port));
          // Rank 0 has begun to meet in round 1 (its communicator's first key, under attempt 1's).
          auto round1 = attempt_store(agents, 1);
          round1->wait({"chorus/world/created_by/0"}, std::chrono::seconds(60));
          abort_rendezvous(*round1, -1, "round 1 is over: chorusrun forms a newer one");
          agents->set("worker/0", published(0, 2, port));
          agents->set("worker/1", published(1, 2, port));
          return;
        }
        for (const auto& [k, v] : launcher_environment(place(ctx.rank, 0, port))) setenv(k.c_str(), v.c_str(), 1);
        setenv("CHORUS_ELASTIC", "1", 1);
        setenv("CHORUS_AGENT_ADDR", "127.0.0.1", 1);
        setenv("CHORUS_AGENT_PORT", std::to_string(port).c_str(), 1);
        at::set_num_threads(1);
        int64_t step = 0;
        elastic::State state{{"step", step}};
        std::vector<std::string> rounds;
        elastic::run(state, [&](ProcessGroup& world) {
          rounds.push_back(std::getenv("CHORUS_RESTART_COUNT"));
          if (rounds.size() == 1) {  // the first group fails: rank 1 leaves it
            if (world.rank() == 1) world.communicator().abort("rank 1 left the group");
            world.barrier();
          }
          at::Tensor one = torch::ones({1});
          world.all_reduce_(one);
          RANK_CHECK(one.item<float>() == 2, "the group of round ", rounds.back(), " summed ", one.item<float>());
        });
        RANK_CHECK((rounds == std::vector<std::string>{"0", "2"}), "trained in rounds ",
                   rounds.size() > 1 ? rounds[1] : "-");
        destroy_process_group();
      },
      std::chrono::seconds(120)));
}

}  // namespace
}  // namespace chorus::test
