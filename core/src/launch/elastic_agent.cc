#include "chorus/core/elastic_agent.h"

#include "launch/elastic_agent_impl.h"

namespace chorus {

// Note [Elastic rendezvous]: how the agents of `chorusrun --nnodes MIN:MAX` agree on a round.
//
// Every agent serves a store of its own (TcpStoreServer, with the job's secret if one is set)
// holding, under "state", its acceptor record: the highest proposal it promised and the last
// round it accepted. A proposer (an --rdzv-endpoint agent for the first round, any member of
// the last round after that) runs three steps against the other agents' stores, each a
// compare-and-set on "state", so that two proposers racing on one agent are ordered:
//   1. promise: proposal (round number, proposer id) goes into every reachable agent's record
//      unless a higher one is there. The answers carry each agent's node, configuration and last
//      round, and the nodes waiting to join that it heard of.
//   2. accept: when a majority of the previous round's nodes promised (the first round: of the
//      endpoints), and MIN <= candidates, every member of the new round stores it, still under
//      this proposal. A majority is more than half, or exactly half when that half holds the
//      previous round's node 0 (the first endpoint): of two halves only one can.
//   3. go: the same records are marked to go. An agent starts its workers only for a round that
//      goes, and stops them as soon as its record promises a higher round than the one they run.
// Two rounds never run at once: each needs a majority of the one before, so their voters
// overlap (two majorities of one round always share a node), and an agent that promised the
// later one stops the earlier one's workers; a round whose members did not all accept never goes. Ranks follow the previous round's order (the
// survivors keep their relative order, so rank 0 is the oldest node), newcomers after them.
//
// What this costs: a majority is needed, so a job of 2 nodes that loses its node 0 (host dead or
// cut off: the two cases look the same from the other side) cannot go on alone, while one that
// loses node 1 can; so can any whose lost node's agent still answers (only its workers died),
// since that agent still votes. MIN caps the other way: fewer than MIN willing nodes wait up to
// the join timeout, then the agents exit naming the nodes lost.
//
// Liveness while a round runs: a monitor thread reads every other member's record each
// heartbeat (500 ms); a refused or closed connection (its agent died, or its host's processes
// were killed) is a loss at once, silence (a cut link) after dead_after (2.5 s). The workers see
// peers die faster (Note [Done, then gone]); their failure reaches the agent as a failed worker.

std::shared_ptr<TcpStore> ElasticAgent::Impl::peer(const std::string& addr, int port) {
  const std::string key = where(addr, port);
  {
    std::lock_guard<std::mutex> lock(peers_mu);
    auto it = peers.find(key);
    if (it != peers.end()) return it->second;
  }
  std::shared_ptr<TcpStore> client;
  try {
    client = std::make_shared<TcpStore>(addr, port, kContactTimeout, o.secret);
  } catch (const StoreError& e) {
    if (std::string(e.what()).find("secret") != std::string::npos)
      throw ElasticError(concat("the agent at ", key, " refused this one: ", e.what()));
    throw;
  }
  std::lock_guard<std::mutex> lock(peers_mu);
  return peers.emplace(key, client).first->second;
}

ElasticAgent::ElasticAgent(ElasticOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.o = std::move(options);
  const ElasticOptions& o = s.o;
  if (o.min_nodes < 1) throw ElasticError(concat("--nnodes ", o.min_nodes, ":", o.max_nodes, ": MIN must be >= 1"));
  if (o.min_nodes > o.max_nodes)
    throw ElasticError(concat("--nnodes ", o.min_nodes, ":", o.max_nodes, ": MIN must not exceed MAX"));
  if (o.endpoints.empty()) throw ElasticError("an elastic job needs --rdzv-endpoint host[:port][,host[:port]...]");
  s.config = concat("run ", o.run_id, " nnodes ", o.min_nodes, ":", o.max_nodes, " nproc-per-node ", o.nproc_per_node);
  // Serve an endpoint this host owns; else any port of the address that reaches the endpoints.
  for (size_t i = 0; i < o.endpoints.size() && !s.server; ++i) {
    if (!o.local_addr.empty() && o.local_addr != o.endpoints[i].first) continue;
    try {
      s.server = std::make_unique<TcpStoreServer>(o.endpoints[i].first, o.endpoints[i].second, o.secret);
      s.endpoint_index = int(i);
      s.self.addr = o.endpoints[i].first;
    } catch (const StoreError&) {
    }
  }
  if (!s.server) {
    s.self.addr =
        o.local_addr.empty() ? net::local_address_toward(o.endpoints[0].first, o.endpoints[0].second) : o.local_addr;
    s.server = std::make_unique<TcpStoreServer>(s.self.addr, 0, o.secret);
  }
  s.self.port = s.server->port();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  s.self.host = host[0] ? host : s.self.addr;
  std::random_device random;
  s.self.id = concat(s.self.host, "-", getpid(), "-", std::hex, random() & 0xffff);
  s.local = std::make_shared<TcpStore>(s.self.addr, s.self.port, 5000ms, o.secret);
  s.local->set(kInfo, s.config + "\n" + encode_node(s.self));
  s.local->set(kState, Record{}.encode());
}

ElasticAgent::~ElasticAgent() {
  impl_->stop_monitor();
  impl_->leave_waiting_lists();
}

const NodeInfo& ElasticAgent::self() const { return impl_->self; }

Round ElasticAgent::next_round(Cause cause) {
  Impl& s = *impl_;
  const ElasticOptions& o = s.o;
  s.stop_monitor();
  s.end_rendezvous();
  s.drop_round();
  const auto start = Clock::now();
  const auto deadline = start + o.join_timeout;
  // Who proposes first: the previous round's node 0 at once, the others after it in their order
  // (first round: the endpoints in the order listed). A node in neither, or left out of a newer
  // round, announces itself and waits to be taken in.
  auto my_turn_index = [&] {
    if (s.excluded) return -1;
    if (s.current.number >= 0) return s.current.node_rank_of(s.self.id);
    return s.endpoint_index;
  };
  int turn = my_turn_index();
  if (turn < 0) s.announce();
  int64_t ended = s.current.number;
  std::mt19937 jitter(std::random_device{}());
  auto my_turn = start + turn * 300ms;
  std::optional<Clock::time_point> enough_since;  // first round: MIN nodes seen since
  for (;;) {
    const Record mine = s.own_record();
    if (mine.go && mine.accepted.number > ended && mine.accepted.node_rank_of(s.self.id) >= 0) {
      try {
        s.excluded = false;
        s.start_round(mine.accepted);
        return s.current;
      } catch (const StoreError& e) {  // its node 0 vanished before serving the round's store
        say(o, concat("round ", mine.accepted.number, " could not start (", e.what(), "); forming another"));
        ended = mine.accepted.number;
        s.current = mine.accepted;
        cause = Cause::Failure;
        turn = my_turn_index();
        my_turn = Clock::now() + std::max(turn, 0) * 300ms;
      }
    }
    if (turn >= 0 && Clock::now() >= my_turn) {
      const bool over = enough_since && Clock::now() - *enough_since >= o.last_call;
      Impl::Outcome outcome;
      try {
        outcome = s.propose(cause, over);
      } catch (const ElasticError& e) {
        // Said where the other agents look, and kept there a moment so they read it before
        // this agent's store goes away with it.
        fail(e.what());
        std::this_thread::sleep_for(o.dead_after);
        throw;
      }
      if (outcome == Impl::Outcome::NotYet && s.last_problem == kLastCall && !enough_since) enough_since = Clock::now();
      if (s.excluded) {
        say(o, concat(s.last_problem, ": this node asks to join it"));
        turn = -1;
        s.announce();
      }
      // Outbid: another proposer is ahead; give it time to finish before trying again.
      if (outcome == Impl::Outcome::Outbid) my_turn = Clock::now() + 1s + std::chrono::milliseconds(jitter() % 500);
      if (outcome == Impl::Outcome::NotYet) my_turn = Clock::now() + 200ms + std::chrono::milliseconds(jitter() % 100);
      continue;
    }
    if (Clock::now() >= deadline) {
      std::string why = s.last_problem;
      if (why.empty() && !s.reached_any && turn < 0) {
        std::string eps;
        for (const auto& [a, p] : o.endpoints) eps += (eps.empty() ? "" : ", ") + where(a, p);
        why = concat("no agent of run '", o.run_id, "' answered at ", eps, " (has the job finished, or not started?)");
      }
      if (why.empty()) why = "no round that includes this node was formed";
      throw ElasticError(concat("no round could be formed within ",
                                std::chrono::duration_cast<std::chrono::seconds>(o.join_timeout).count(), " s: ", why));
    }
    std::this_thread::sleep_for(50ms);
  }
}

std::optional<std::string> ElasticAgent::check() {
  std::lock_guard<std::mutex> lock(impl_->mon_mu);
  return impl_->stop_reason;
}

int ElasticAgent::nodes_waiting() const {
  std::lock_guard<std::mutex> lock(impl_->mon_mu);
  return impl_->waiting_count;
}

bool ElasticAgent::reform_requested() { return impl_->round_has(kReformKey); }

bool ElasticAgent::workers_in_process() { return impl_->learn_in_process(); }

bool ElasticAgent::round_requested() {
  try {
    if (!impl_->local->check({kRequestKey})) return false;
    // "<round the worker was in> <why>": a request from a round already left is answered.
    std::istringstream in(impl_->local->get(kRequestKey));
    int64_t round = -1;
    in >> round;
    return round >= impl_->current.number;
  } catch (const StoreError&) {
    return false;
  }
}

void ElasticAgent::publish_worker_env(int local_rank, const std::vector<std::pair<std::string, std::string>>& env) {
  std::string text = concat(impl_->current.number, "\n");
  for (const auto& [k, v] : env) text += k + "=" + v + "\n";
  impl_->local->set(worker_key(local_rank), text);
}

bool ElasticAgent::workers_watch() { return impl_->round_has(kWatchingKey); }

void ElasticAgent::finish() {
  Impl& s = *impl_;
  s.stop_monitor();
  s.local->set(kClosed, "finished");
  // Stay until every other node's workers are done too: node 0 serves the round's store, and an
  // agent that vanished early would look lost to the monitors of the nodes still running. A
  // node that stops answering for dead_after is not waited for.
  for (const auto& m : s.current.members) {
    if (m.id == s.self.id) continue;
    auto heard = Clock::now();
    while (Clock::now() - heard < s.o.dead_after) {
      try {
        if (s.peer(m.addr, m.port)->check({kClosed})) break;
        heard = Clock::now();
      } catch (const StoreError&) {
        s.forget(m.addr, m.port);
        std::this_thread::sleep_for(100ms);
        continue;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
}

void ElasticAgent::fail(const std::string& why) {
  try {
    impl_->local->set(kClosed, "failed " + why);
  } catch (const StoreError&) {
  }
}

}  // namespace chorus
