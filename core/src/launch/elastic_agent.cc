#include "chorus/core/elastic_agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "chorus/core/tcp_store.h"
#include "launch/elastic_record.h"
#include "store/socket_util.h"

namespace chorus {

using detail::concat;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

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
// overlap (two majorities of one round always share a node), and an agent that promised the later one stops the earlier one's workers; a round
// whose members did not all accept never goes. Ranks follow the previous round's order (the
// survivors keep their relative order, so rank 0 is the oldest node), newcomers after them.
//
// What this costs: a majority is needed, so a job of 2 nodes that loses its node 0 (host dead or
// cut off: the two cases look the same from the other side) cannot go on alone, while one that
// loses node 1 can; so can any whose lost node's agent still answers (only its workers died),
// since that agent still votes. MIN caps the
// other way: fewer than MIN willing nodes wait up to the join timeout, then the agents exit
// naming the nodes lost.
//
// Liveness while a round runs: a monitor thread reads every other member's record each
// heartbeat (500 ms); a refused or closed connection (its agent died, or its host's processes
// were killed) is a loss at once, silence (a cut link) after dead_after (2.5 s). The workers see
// peers die faster (Note [Done, then gone]); their failure reaches the agent as a failed worker.

namespace {

// Connecting to or asking another agent. Short: an agent that does not answer this fast is
// asked again in the next attempt (every 200-300 ms), and one silent for dead_after is lost.
constexpr auto kContactTimeout = 300ms;
constexpr const char* kLastCall = "waiting for more nodes (last call)";

void say(const ElasticOptions& o, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", o.name.c_str(), what.c_str());
  std::fflush(stderr);
}

}  // namespace

using namespace elastic_record;

struct ElasticAgent::Impl {
  ElasticOptions o;
  NodeInfo self;
  std::string config;       // what every agent of the job must agree on
  int endpoint_index = -1;  // this agent serves endpoints[endpoint_index]
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStore> local;

  std::mutex peers_mu;
  std::map<std::string, std::shared_ptr<TcpStore>> peers;  // "addr:port" -> client

  Round current;                                // the round whose workers run (number -1: none)
  std::unique_ptr<TcpStoreServer> round_store;  // served here when this node is the round's node 0
  std::shared_ptr<TcpStore> round_client_;      // see round_client()
  std::mutex round_mu;

  // A client of the round's store, made when first needed (node 0 may already have moved on
  // when a round ends at once); null when it cannot be reached.
  std::shared_ptr<TcpStore> round_client() {
    std::lock_guard<std::mutex> lock(round_mu);
    if (!round_client_ && current.store_port > 0) {
      try {
        round_client_ =
            std::make_shared<TcpStore>(current.members[0].addr, current.store_port, kContactTimeout, o.secret);
      } catch (const StoreError&) {
      }
    }
    return round_client_;
  }
  void drop_round() {
    std::lock_guard<std::mutex> lock(round_mu);
    round_client_.reset();
    round_store.reset();
  }
  // Asks the round's store whether `key` is there; false when it cannot be asked (a client that
  // failed is made again next time).
  bool round_has(const std::string& key) {
    auto rc = round_client();
    try {
      return rc && rc->check({key});
    } catch (const StoreError&) {
      std::lock_guard<std::mutex> lock(round_mu);
      if (round_client_ == rc) round_client_.reset();
      return false;
    }
  }
  std::vector<NodeInfo> known_waiting;
  std::vector<NodeInfo> last_members;  // of the last round this agent was in, for proposing
  std::string last_problem;            // why no round formed yet, for the timeout's message
  std::set<std::string> warned;
  std::atomic<bool> in_process{false};  // the workers said so (sticky: they keep their processes)

  // The monitor's findings while a round runs.
  std::mutex mon_mu;
  std::condition_variable mon_cv;
  std::thread monitor;
  bool mon_stop = false;
  std::optional<std::string> stop_reason;
  int waiting_count = 0;

  // A client of the agent at addr:port. Throws StoreError when it cannot be reached, and
  // ElasticError when it refuses this agent's secret (another job, or a mistyped secret).
  std::shared_ptr<TcpStore> peer(const std::string& addr, int port) {
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
  void forget(const std::string& addr, int port) {
    std::lock_guard<std::mutex> lock(peers_mu);
    peers.erase(where(addr, port));
  }

  // Applies `change` to the record in `store` atomically (compare-and-set, retried on races).
  // Returns the record stored afterwards and whether `change` was applied.
  template <class Change>
  std::pair<Record, bool> update(Store& store, Change&& change) {
    std::string seen = store.get(kState);
    for (int attempt = 0; attempt < 100; ++attempt) {
      Record r = Record::decode(seen);
      if (!change(r)) return {Record::decode(seen), false};
      const std::string want = r.encode();
      const std::string now = store.compare_set(kState, seen, want);
      if (now == want) return {r, true};
      seen = now;
    }
    throw StoreError("the rendezvous record kept changing under this agent");
  }

  Record own_record() { return Record::decode(local->get(kState)); }

  // --- Proposing -----------------------------------------------------------------------------

  struct Reply {
    std::string addr;
    int port = 0;
    bool reached = false, promised = false, config_ok = true;
    std::string their_config, closed, error;
    NodeInfo node;
    Record record;
    std::vector<NodeInfo> waiting;
  };

  // Reads an agent's node, configuration, record, waiting list and closing word.
  Reply read(const std::string& addr, int port) {
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

  // Step 1 on one agent that was read: records the promise unless a higher one is there.
  void ask_promise(Reply& r, int64_t round) {
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

  // Step 2 or 3 on one member: true when its record still holds this proposal.
  bool ask_accept(const NodeInfo& n, int64_t round, const Round* accept) {
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

  template <class T, class F>
  std::vector<std::invoke_result_t<F, const T&>> in_parallel(const std::vector<T>& items, F f) {
    std::vector<std::future<std::invoke_result_t<F, const T&>>> futures;
    for (const auto& item : items) futures.push_back(std::async(std::launch::async, [&f, &item] { return f(item); }));
    std::vector<std::invoke_result_t<F, const T&>> out;
    for (auto& fu : futures) out.push_back(fu.get());
    return out;
  }

  template <class T, class F>
  void in_parallel_each(std::vector<T>& items, F f) {
    std::vector<std::future<void>> futures;
    for (auto& item : items) futures.push_back(std::async(std::launch::async, [&f, &item] { f(item); }));
    for (auto& fu : futures) fu.get();
  }

  enum class Outcome { Formed, Outbid, NotYet };
  bool excluded = false;  // a newer round runs without this node: it joins as a newcomer

  Outcome propose(Cause cause, bool first_round_last_call_over) {
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
      for (auto& r :
           in_parallel(batch, [&](const std::pair<std::string, int>& t) { return read(t.first, t.second); })) {
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

  struct Plan {
    std::string problem;  // empty: the round can be formed
    Round prev;           // the last round any agent accepted
    std::vector<NodeInfo> members;
  };

  // Who would be in the next round, given the replies: a node counts when it promised
  // (`promised`), or, before anyone is asked to, when it answered as a willing agent of this job.
  Plan judge(const std::vector<Reply>& replies, const Record& mine, bool promised, bool last_call_over) const {
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
      if (it != by_node.end() && yes(*it->second) && placed.insert(m.id).second)
        plan.members.push_back(it->second->node);
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

  // --- A joining node ------------------------------------------------------------------------

  // Puts this node on the waiting list of every agent it can reach (the endpoints and the
  // members they name). Throws ElasticError when the job has finished or is of another run.
  bool reached_any = false;  // announce() found an agent of this job

  void announce() {
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

  void leave_waiting_lists() {
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

  // --- Running a round -----------------------------------------------------------------------

  void start_round(const Round& r) {
    stop_monitor();
    drop_round();
    local->delete_key(kRequestKey);
    current = r;
    last_members = r.members;
    if (r.members[0].id == self.id) {
      round_store = std::make_unique<TcpStoreServer>(self.addr, 0, o.secret);
      current.store_port = round_store->port();
      current.program_port = net::free_port(self.addr);
      local->set(ports_key(r.number), concat(current.store_port, " ", current.program_port));
    } else {
      // Node 0 serves the round's store once it has stopped its last round's workers.
      auto s = peer(r.members[0].addr, r.members[0].port);
      const auto until = Clock::now() + o.join_timeout;
      while (!s->check({ports_key(r.number)})) {
        if (Clock::now() >= until) throw StoreError(concat(r.members[0].name(), " never served round ", r.number));
        if (Record::decode(local->get(kState)).promised > r.number)
          throw StoreError(concat("round ", r.number, " was overtaken by a newer one"));
        std::this_thread::sleep_for(20ms);
      }
      std::istringstream ports(s->get(ports_key(r.number)));
      ports >> current.store_port >> current.program_port;
    }
    // The waiting list named in this round is served now.
    std::string seen = local->check({kWaiting}) ? local->get(kWaiting) : "";
    std::string kept;
    for (const auto& w : decode_nodes(seen))
      if (r.node_rank_of(w.id) < 0) kept += encode_node(w) + "\n";
    local->compare_set(kWaiting, seen, kept);
    start_monitor();
  }

  void start_monitor() {
    {
      std::lock_guard<std::mutex> lock(mon_mu);
      mon_stop = false;
      stop_reason.reset();
      waiting_count = 0;
    }
    monitor = std::thread([this] { watch(); });
  }

  void stop_monitor() {
    {
      std::lock_guard<std::mutex> lock(mon_mu);
      mon_stop = true;
    }
    mon_cv.notify_all();
    if (monitor.joinable()) monitor.join();
  }

  void watch() {
    std::map<std::string, Clock::time_point> heard;
    std::set<std::string> finished;
    for (const auto& m : current.members) heard[m.id] = Clock::now();
    auto flag = [&](std::string why) {
      std::lock_guard<std::mutex> lock(mon_mu);
      if (!stop_reason) stop_reason = std::move(why);
    };
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mon_mu);
        if (mon_cv.wait_for(lock, o.heartbeat, [&] { return mon_stop; })) return;
      }
      try {
        const Record mine = own_record();
        if (mine.promised > current.number) flag(concat("a new round is forming (proposed by ", mine.promiser, ")"));
        const auto waiting = local->check({kWaiting}) ? decode_nodes(local->get(kWaiting)) : std::vector<NodeInfo>{};
        {
          std::lock_guard<std::mutex> lock(mon_mu);
          waiting_count = int(waiting.size());
          known_waiting = waiting;
        }
        if (!waiting.empty())
          if (auto rc = round_client()) rc->set(kWaitingKey, concat(waiting.size()));
        // Learnt while the round's store is there to ask: it may be on the node that is lost.
        if (!in_process) in_process = round_has(kInProcessKey);
      } catch (const StoreError&) {
      }
      for (const auto& m : current.members) {
        if (m.id == self.id || finished.count(m.id)) continue;  // done: may leave
        try {
          auto s = peer(m.addr, m.port);
          const Record theirs = Record::decode(s->get(kState));
          heard[m.id] = Clock::now();
          if (s->check({kClosed})) {
            const std::string closed = s->get(kClosed);
            if (closed.rfind("failed", 0) == 0) flag(concat("the job failed on ", m.name(), ": ", closed.substr(7)));
            if (closed == "finished") finished.insert(m.id);
          }
          if (theirs.promised > current.number) flag(concat("a new round is forming (", m.name(), " promised it)"));
        } catch (const Error& e) {
          forget(m.addr, m.port);
          const std::string what = e.what();
          const bool silent = what.find("within") != std::string::npos && what.find("timed out") != std::string::npos;
          const auto quiet = Clock::now() - heard[m.id];
          if (!silent || quiet >= o.dead_after)
            flag(concat("node ", m.name(), " ",
                        silent ? concat("stopped answering (silent for ",
                                        std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count(), " ms)")
                               : std::string("is gone (its agent does not answer)")));
        }
      }
    }
  }
};

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

bool ElasticAgent::workers_in_process() {
  Impl& s = *impl_;
  if (!s.in_process) s.in_process = s.round_has(kInProcessKey);
  return s.in_process;
}

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
