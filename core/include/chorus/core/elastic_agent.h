// The agents of an elastic job (chorusrun --nnodes MIN:MAX) agreeing on who is in it.
//
// Every agent (one per node) serves a small store of its own and is an acceptor of the
// rendezvous; any agent of the last round can propose the next one. A round is a numbered,
// ordered list of nodes (their node ranks), MIN <= nodes <= MAX; a new round needs a majority of
// the previous round's nodes (the first one: of the --rdzv-endpoint hosts; exactly half will do
// when it holds node 0), so a partitioned
// network never runs two jobs and no single host, the first endpoint included, is needed after
// the start. See Note [Elastic rendezvous] in elastic_agent.cc.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/error.h"

namespace chorus {

// What an elastic job cannot go on with: fewer than MIN nodes left, no majority, an agent of
// another job or configuration, a job already finished, the restart budget spent.
class ElasticError : public Error {
 public:
  using Error::Error;
};

struct ElasticOptions {
  std::string run_id = "none";
  int min_nodes = 1, max_nodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;  // failures the job survives (membership changes are free)
  // host:port of the agents that may serve the first rendezvous; an agent whose host owns one
  // of these addresses serves there, the others on `local_addr`:any port.
  std::vector<std::pair<std::string, int>> endpoints;
  std::string local_addr;  // empty: the address this host reaches the first endpoint from
  std::string secret;      // empty: none (CHORUS_RDZV_SECRET)
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);  // to form a round at all
  std::chrono::milliseconds last_call = std::chrono::seconds(3);       // first round: wait for MAX
  std::chrono::milliseconds heartbeat = std::chrono::milliseconds(500);
  std::chrono::milliseconds dead_after = std::chrono::milliseconds(2500);  // silent this long: lost
  std::string name = "chorusrun";                                          // prefix of its messages
};

struct NodeInfo {
  std::string id;    // unique per agent process: a restarted agent is a new node
  std::string host;  // hostname, for messages
  std::string addr;  // where its agent store listens
  int port = 0;
  // "hostB (10.213.0.2)"
  std::string name() const;
};

struct Round {
  int64_t number = -1;            // -1: none yet
  int restarts = 0;               // failures spent so far, job-wide
  std::vector<NodeInfo> members;  // in node-rank order
  // Where the round's workers meet: the store served by members[0]'s agent, and the port left
  // free there for a program's own store (MASTER_PORT, Note [Two ports]).
  int store_port = 0, program_port = 0;
  int node_rank_of(const std::string& id) const;  // -1: not a member
};

class ElasticAgent {
 public:
  // Serves this agent's store; throws ElasticError on bad options (MIN > MAX, MIN < 1, no
  // endpoint) and StoreError when it cannot listen.
  explicit ElasticAgent(ElasticOptions options);
  ~ElasticAgent();
  ElasticAgent(const ElasticAgent&) = delete;
  ElasticAgent& operator=(const ElasticAgent&) = delete;

  const NodeInfo& self() const;

  enum class Cause { Start, Failure, Membership };
  // Blocks until a round including this node starts and returns it. `cause` says why the last
  // round ended (a Failure spends one of --max-restarts, job-wide). Throws ElasticError when
  // none can be formed within the join timeout (naming the nodes lost), when the job was
  // closed, or when the budget is spent; and tells the other agents so.
  Round next_round(Cause cause);

  // While the round's workers run (call it about every 100 ms): a reason to stop them, if any
  // ("node hostB (10.213.0.2) stopped answering", "hostC asked for a new round").
  std::optional<std::string> check();
  // Nodes waiting to join (published to the workers as chorus/elastic/nodes_waiting).
  int nodes_waiting() const;
  // True when the workers of the round asked for a new one at a step boundary (they left
  // because nodes were waiting).
  bool reform_requested();
  // True when the workers look for waiting nodes themselves (chorus::elastic::nodes_waiting),
  // so the agent leaves the step boundary to them.
  bool workers_watch();

  // In-process recovery (Note [Elastic in process]): the workers of this round run inside
  // chorus::elastic::run and survive a change of membership.
  bool workers_in_process();
  // A local worker asked for a new round (its group failed and the agents noticed nothing).
  bool round_requested();
  // Tells local worker `local_rank` its place in the round just formed (its variables).
  void publish_worker_env(int local_rank, const std::vector<std::pair<std::string, std::string>>& env);

  // This node's workers finished: tells the others and, when this node serves the round's
  // store, waits (bounded) for the other nodes' workers to finish too.
  void finish();
  // The job failed here for good (`why`): the other agents stop theirs and exit too.
  void fail(const std::string& why);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "a:1,b:2" -> {a,1},{b,2}; a missing port is `default_port`. Throws InvalidArgument.
std::vector<std::pair<std::string, int>> parse_endpoints(const std::string& list, int default_port);

}  // namespace chorus
