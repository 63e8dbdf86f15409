// ElasticAgent: running a round, its store on node 0, and the monitor that watches the other
// members (Note [Elastic rendezvous] in elastic_agent.cc).

#include "launch/elastic_agent_impl.h"

namespace chorus {

void ElasticAgent::Impl::start_round(const Round& r) {
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

void ElasticAgent::Impl::start_monitor() {
  {
    std::lock_guard<std::mutex> lock(mon_mu);
    mon_stop = false;
    stop_reason.reset();
    waiting_count = 0;
  }
  monitor = std::thread([this] { watch(); });
}

void ElasticAgent::Impl::stop_monitor() {
  {
    std::lock_guard<std::mutex> lock(mon_mu);
    mon_stop = true;
  }
  mon_cv.notify_all();
  if (monitor.joinable()) monitor.join();
}

void ElasticAgent::Impl::watch() {
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
      learn_in_process();
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
        // No answer within the contact timeout (a cut link, a stalled host) is silence, lost only
        // after dead_after; a refused or closed connection means its agent is gone.
        const bool silent = what.find("within") != std::string::npos;
        const auto quiet = Clock::now() - heard[m.id];
        if (!silent || quiet >= o.dead_after)
          flag(concat("node ", m.name(), " ",
                      silent ? concat("stopped answering (silent for ",
                                      std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count(), " ms)")
                             : concat("is gone (its agent does not answer: ", what, ")")));
      }
    }
  }
}

}  // namespace chorus
