// ElasticAgent: proposing a round (Note [Elastic rendezvous] in elastic_agent.cc) and joining a
// running job as a newcomer.

#include "launch/elastic_agent_impl.h"

namespace chorus {

ElasticAgent::Impl::Reply ElasticAgent::Impl::read(const std::string& addr, int port) {
  Reply r;
  r.addr = addr;
  r.port = port;
  try {
    auto s = peer(addr, port);
    const std::string info = s->get(kInfo);
    const size_t nl = info.find('\n');
    r.their_config = info.substr(0, nl);
    const auto nodes = decode_nodes(info.substr(nl + 1));
    if (!nodes.empty()) r.node = nodes.front();
    r.config_ok = r.their_config == config;
    if (s->check({kClosed})) r.closed = s->get(kClosed);
    if (s->check({kWaiting})) r.waiting = decode_nodes(s->get(kWaiting));
    r.record = Record::decode(s->get(kState));
    r.reached = true;
  } catch (const StoreError& e) {
    forget(addr, port);
    r.error = e.what();
  }
  return r;
}

void ElasticAgent::Impl::ask_promise(Reply& r, int64_t round) {
  if (!r.reached || !r.config_ok || !r.closed.empty()) return;
  try {
    auto [record, applied] = update(*peer(r.addr, r.port), [&](Record& rec) {
      if (rec.outranks(round, self.id) || (rec.promised == round && rec.promiser == self.id)) return false;
      rec.promised = round;
      rec.promiser = self.id;
      return true;
    });
    r.record = record;
    r.promised = applied || (record.promised == round && record.promiser == self.id);
  } catch (const StoreError& e) {
    forget(r.addr, r.port);
    r.reached = false;
    r.error = e.what();
  }
}

bool ElasticAgent::Impl::ask_accept(const NodeInfo& n, int64_t round, const Round* accept) {
  try {
    auto s = peer(n.addr, n.port);
    return update(*s,
                  [&](Record& rec) {
                    if (rec.promised != round || rec.promiser != self.id) return false;
                    if (accept) {
                      rec.accepted = *accept;
                      rec.go = false;
                    } else {
                      if (rec.accepted.number != round) return false;
                      rec.go = true;
                    }
                    return true;
                  })
        .second;
  } catch (const StoreError&) {
    forget(n.addr, n.port);
    return false;
  }
}

ElasticAgent::Impl::Outcome ElasticAgent::Impl::propose(Cause cause, bool first_round_last_call_over) {
  const Record mine = own_record();
  // Whom to ask: the endpoints, the last round's members, anyone waiting; then whoever the
  // answers name that was not asked yet. Reading first, promising after: a node that finds
  // itself left out of a newer round must not disturb it.
  std::vector<std::pair<std::string, int>> targets;
  std::set<std::string> asked;
  auto add = [&](const std::string& addr, int port) {
    if (asked.insert(where(addr, port)).second) targets.emplace_back(addr, port);
  };
  for (const auto& [a, p] : o.endpoints) add(a, p);
  for (const auto& m : last_members) add(m.addr, m.port);
  for (const auto& m : mine.accepted.members) add(m.addr, m.port);
  for (const auto& w : known_waiting) add(w.addr, w.port);
  std::vector<Reply> replies;
  while (!targets.empty()) {
    auto batch = std::move(targets);
    targets.clear();
    for (auto& r : in_parallel(batch, [&](const std::pair<std::string, int>& t) { return read(t.first, t.second); })) {
      for (const auto& w : r.waiting) add(w.addr, w.port);
      for (const auto& m : r.record.accepted.members) add(m.addr, m.port);
      replies.push_back(std::move(r));
    }
  }
  int64_t newest = std::max(mine.promised, mine.accepted.number);
  for (const auto& r : replies) {
    if (!r.reached) continue;
    if (r.closed.rfind("failed", 0) == 0)
      throw ElasticError(concat("the job failed on ", r.node.name(), ": ", r.closed.substr(7)));
    if (r.closed == "finished" && r.config_ok)
      throw ElasticError(concat("the job finished on ", r.node.name(), " while this node was between rounds"));
    if (!r.config_ok) {
      if (current.number < 0 && r.node.id != self.id)
        throw ElasticError(concat("the agent on ", r.node.name(), " was started with '", r.their_config,
                                  "', this one with '", config, "': every agent of a job needs the same"));
      if (warned.insert(r.node.id).second)
        say(o, concat("ignoring the agent on ", r.node.name(), ": it was started with '", r.their_config,
                      "', this one with '", config, "'"));
      continue;
    }
    newest = std::max({newest, r.record.promised, r.record.accepted.number});
    // A round newer than the one this node ran, without this node: join it instead.
    if (r.record.accepted.number > current.number && r.record.go && r.record.accepted.node_rank_of(self.id) < 0) {
      excluded = true;
      last_problem = concat("round ", r.record.accepted.number, " runs without this node");
      return Outcome::Outbid;
    }
  }
  // Whether a round can be formed is first judged from what was read, so that no agent is
  // asked to promise (and stop its workers) for a round that cannot form yet; then again from
  // the promises.
  Plan plan = judge(replies, mine, false, first_round_last_call_over);
  if (!plan.problem.empty()) {
    last_problem = plan.problem;
    return Outcome::NotYet;
  }
  const int64_t round = newest + 1;
  in_parallel_each(replies, [&](Reply& r) { ask_promise(r, round); });
  for (const auto& r : replies)
    if (r.reached && r.config_ok && !r.promised && r.record.outranks(round, self.id)) return Outcome::Outbid;
  plan = judge(replies, mine, true, first_round_last_call_over);
  if (!plan.problem.empty()) {
    last_problem = plan.problem;
    return Outcome::NotYet;
  }
  Round next;
  next.number = round;
  next.members = plan.members;
  // A failure is spent once, by the round that follows the one it ended: a proposer that finds
  // a newer round already formed (another node dealt with the same failure) spends nothing.
  next.restarts = std::max(plan.prev.restarts, 0) +
                  (cause == Cause::Failure && plan.prev.number >= 0 && plan.prev.number <= current.number ? 1 : 0);
  if (next.restarts > o.max_restarts)
    throw ElasticError(
        concat("the job failed ", next.restarts, " time(s) and --max-restarts is ", o.max_restarts, ": giving up"));
  for (bool ok : in_parallel(next.members, [&](const NodeInfo& n) { return ask_accept(n, round, &next); }))
    if (!ok) return Outcome::Outbid;
  for (bool ok : in_parallel(next.members, [&](const NodeInfo& n) { return ask_accept(n, round, nullptr); }))
    if (!ok) return Outcome::Outbid;
  return Outcome::Formed;
}

ElasticAgent::Impl::Plan ElasticAgent::Impl::judge(const std::vector<Reply>& replies, const Record& mine, bool promised,
                                                   bool last_call_over) const {
  Plan plan;
  auto yes = [&](const Reply& r) { return promised ? r.promised : r.reached && r.config_ok && r.closed.empty(); };
  // Deduplicate by node (an endpoint address and a member address may be the same agent).
  std::map<std::string, const Reply*> by_node;
  for (const auto& r : replies)
    if (r.reached) by_node.emplace(r.node.id, &r);
  Round& prev = plan.prev;
  for (const auto& [id, r] : by_node)
    if (yes(*r) && r->record.accepted.number > prev.number) prev = r->record.accepted;
  if (mine.accepted.number > prev.number) prev = mine.accepted;

  // A majority of the previous round's nodes (the first round: of the endpoints), or exactly
  // half of them when that half holds its node 0 (the first endpoint): two halves of a split
  // network cannot both hold it.
  int voters = 0, electorate = 0;
  bool first_voted = false;
  std::string silent;
  auto vote = [&](bool v, const std::string& who) {
    if (electorate == 0) first_voted = v;
    ++electorate;
    voters += v;
    if (!v) silent += (silent.empty() ? "" : ", ") + who;
  };
  if (prev.number < 0) {
    for (const auto& [a, p] : o.endpoints) {
      bool v = false;
      for (const auto& r : replies) v = v || (r.addr == a && r.port == p && yes(r));
      vote(v, where(a, p));
    }
  } else {
    for (const auto& m : prev.members) {
      auto it = by_node.find(m.id);
      vote(it != by_node.end() && yes(*it->second), m.name());
    }
  }
  if (voters * 2 < electorate || (voters * 2 == electorate && !first_voted)) {
    plan.problem = prev.number < 0
                       ? concat("the first round needs more than half of the ", electorate,
                                " --rdzv-endpoint agents (or half with the first); ", silent, " did not answer")
                       : concat("a new round needs more than half of round ", prev.number, "'s ", electorate,
                                " nodes (or half with its node 0); lost: ", silent);
    return plan;
  }
  // The members: the previous round's survivors in their order, then newcomers by id.
  std::set<std::string> placed;
  for (const auto& m : prev.members) {
    auto it = by_node.find(m.id);
    if (it != by_node.end() && yes(*it->second) && placed.insert(m.id).second) plan.members.push_back(it->second->node);
  }
  // Newcomers: the endpoints' agents in the order listed, then the others by id.
  auto endpoint_of = [&](const NodeInfo& n) {
    for (size_t i = 0; i < o.endpoints.size(); ++i)
      if (o.endpoints[i].first == n.addr && o.endpoints[i].second == n.port) return int(i);
    return int(o.endpoints.size());
  };
  std::vector<NodeInfo> fresh;
  for (const auto& [id, r] : by_node)
    if (yes(*r) && !placed.count(id)) fresh.push_back(r->node);
  std::sort(fresh.begin(), fresh.end(), [&](const NodeInfo& a, const NodeInfo& b) {
    return std::make_pair(endpoint_of(a), a.id) < std::make_pair(endpoint_of(b), b.id);
  });
  for (auto& n : fresh)
    if (int(plan.members.size()) < o.max_nodes) plan.members.push_back(n);
  if (int(plan.members.size()) < o.min_nodes) {
    std::vector<NodeInfo> lost;
    for (const auto& m : prev.members)
      if (!placed.count(m.id)) lost.push_back(m);
    plan.problem =
        concat(plan.members.size(), " node(s) can form a round, fewer than the minimum of ", o.min_nodes,
               prev.number < 0 ? std::string() : concat("; lost since round ", prev.number, ": ", names(lost)));
  } else if (prev.number < 0 && int(plan.members.size()) < o.max_nodes && !last_call_over) {
    plan.problem = kLastCall;
  }
  return plan;
}

void ElasticAgent::Impl::announce() {
  std::vector<std::pair<std::string, int>> targets(o.endpoints.begin(), o.endpoints.end());
  std::set<std::string> asked;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto [addr, port] = targets[i];
    if (!asked.insert(where(addr, port)).second || (addr == self.addr && port == self.port)) continue;
    try {
      auto s = peer(addr, port);
      const std::string info = s->get(kInfo);
      const std::string theirs = info.substr(0, info.find('\n'));
      if (theirs != config)
        throw ElasticError(concat("the agent at ", where(addr, port), " belongs to another job or configuration ('",
                                  theirs, "'; this agent: '", config, "')"));
      if (s->check({kClosed})) {
        const std::string closed = s->get(kClosed);
        throw ElasticError(concat("the job '", o.run_id, "' has ",
                                  closed == "finished" ? std::string("finished") : closed,
                                  ": there is nothing to join (agent at ", where(addr, port), ")"));
      }
      reached_any = true;
      const std::string me = encode_node(self) + "\n";
      std::string seen = s->check({kWaiting}) ? s->get(kWaiting) : "";
      while (seen.find(me) == std::string::npos) {
        const std::string now = s->compare_set(kWaiting, seen, seen + me);
        if (now == seen + me) break;
        seen = now;
      }
      for (const auto& m : Record::decode(s->get(kState)).accepted.members) targets.emplace_back(m.addr, m.port);
    } catch (const StoreError&) {
      forget(addr, port);
    }
  }
}

void ElasticAgent::Impl::leave_waiting_lists() {
  const std::string me = encode_node(self) + "\n";
  std::lock_guard<std::mutex> lock(peers_mu);
  for (auto& [key, s] : peers) {
    try {
      std::string seen = s->check({kWaiting}) ? s->get(kWaiting) : "";
      for (int i = 0; i < 20 && seen.find(me) != std::string::npos; ++i) {
        std::string without = seen;
        without.erase(without.find(me), me.size());
        const std::string now = s->compare_set(kWaiting, seen, without);
        if (now == without) break;
        seen = now;
      }
    } catch (const StoreError&) {
    }
  }
}

}  // namespace chorus
