// ElasticAgent's state and steps, shared by its files: elastic_agent.cc (the public face and
// Note [Elastic rendezvous]), elastic_propose.cc (forming a round, joining one) and
// elastic_round.cc (running one and watching its members).
#pragma once

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

#include "chorus/core/rendezvous.h"
#include "chorus/core/tcp_store.h"
#include "launch/elastic_record.h"
#include "store/socket_util.h"

#include "chorus/core/elastic.h"
#include "chorus/core/elastic_agent.h"

namespace chorus {

using detail::concat;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using namespace elastic_record;

// Connecting to or asking another agent. Short: an agent that does not answer this fast is
// asked again in the next attempt (every 200-300 ms), and one silent for dead_after is lost.
inline constexpr auto kContactTimeout = 300ms;
inline constexpr const char* kLastCall = "waiting for more nodes (last call)";

inline void say(const ElasticOptions& o, const std::string& what) {
  std::fprintf(stderr, "%s: %s%s\n", o.name.c_str(), elastic::trace_stamp().c_str(), what.c_str());
  std::fflush(stderr);
}

struct ElasticAgent::Impl {
  ElasticOptions o;
  NodeInfo self;
  std::string config;       // what every agent of the job must agree on
  int endpoint_index = -1;  // this agent serves endpoints[endpoint_index]
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStore> local;

  std::mutex peers_mu;
  std::map<std::string, std::shared_ptr<TcpStore>> peers;  // "addr:port" -> client

  Round current;                                         // the round whose workers run (number -1: none)
  std::unique_ptr<TcpStoreServer> round_store;           // served here when this node is the round's node 0
  std::unique_ptr<TcpStoreServer> previous_round_store;  // the last round's, until the next one starts
  std::shared_ptr<TcpStore> round_client_;               // see round_client()
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
  // The round this node serves is over (next_round): ranks still meeting in its store stop
  // waiting (Note [Elastic in process]: a worker on its way into a group whose round was
  // overtaken waits for ranks that went on to the newer one).
  void end_rendezvous() {
    if (!round_store) return;
    try {
      if (auto rc = round_client())
        abort_rendezvous(*attempt_store(rc, int(current.number)), -1,
                         concat("round ", current.number, " is over: chorusrun forms a newer one"));
    } catch (const StoreError&) {
    }
  }
  // The round's store is kept until the next round starts: in-process workers still tell it
  // that they leave the old group, and a store gone at that moment costs each of them its
  // client's reconnect wait (2 s).
  void drop_round() {
    std::lock_guard<std::mutex> lock(round_mu);
    round_client_.reset();
    if (round_store) previous_round_store = std::move(round_store);
  }
  // Whether the workers recover in process (sticky): their own word in this agent's store, or
  // rank 0's in the round's.
  bool learn_in_process() {
    if (!in_process) {
      try {
        in_process = local->check({kInProcessKey});
      } catch (const StoreError&) {
      }
    }
    if (!in_process) in_process = round_has(kInProcessKey);
    return in_process;
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
  std::shared_ptr<TcpStore> peer(const std::string& addr, int port);
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
  Reply read(const std::string& addr, int port);

  // Step 1 on one agent that was read: records the promise unless a higher one is there.
  void ask_promise(Reply& r, int64_t round);

  // Step 2 or 3 on one member: true when its record still holds this proposal.
  bool ask_accept(const NodeInfo& n, int64_t round, const Round* accept);

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

  Outcome propose(Cause cause, bool first_round_last_call_over);

  struct Plan {
    std::string problem;  // empty: the round can be formed
    Round prev;           // the last round any agent accepted
    std::vector<NodeInfo> members;
  };

  // Who would be in the next round, given the replies: a node counts when it promised
  // (`promised`), or, before anyone is asked to, when it answered as a willing agent of this job.
  Plan judge(const std::vector<Reply>& replies, const Record& mine, bool promised, bool last_call_over) const;

  // --- A joining node ------------------------------------------------------------------------

  // Puts this node on the waiting list of every agent it can reach (the endpoints and the
  // members they name). Throws ElasticError when the job has finished or is of another run.
  bool reached_any = false;  // announce() found an agent of this job

  void announce();

  void leave_waiting_lists();

  // --- Running a round -----------------------------------------------------------------------

  void start_round(const Round& r);

  void start_monitor();

  void stop_monitor();

  void watch();
};

}  // namespace chorus
