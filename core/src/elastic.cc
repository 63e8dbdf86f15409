#include "chorus/core/elastic.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/tcp_store.h"
#include "launch/elastic_record.h"

namespace chorus::elastic {

using detail::concat;

namespace {

// The keys chorusrun reads in the round's store and in its own.
using namespace elastic_record;

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw InvalidArgument(concat("chorus::elastic: ", name, " is not set (not under an elastic chorusrun)"));
  return v;
}

// A client of the store at the address in variables addr_var/port_var, made again when they
// change (a new round has a store of its own).
class StoreOf {
 public:
  StoreOf(const char* addr_var, const char* port_var) : addr_var_(addr_var), port_var_(port_var) {}
  Store& get() {
    const std::string where = env_or_throw(addr_var_) + ":" + env_or_throw(port_var_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!store_ || where != where_) {
      store_ = std::make_shared<TcpStore>(env_or_throw(addr_var_), std::atoi(env_or_throw(port_var_).c_str()));
      where_ = where;
      told_.clear();
    }
    return *store_;
  }
  // Sets key once per store.
  void tell_once(const std::string& key) {
    Store& s = get();
    std::lock_guard<std::mutex> lock(mu_);
    if (told_.find("\n" + key + "\n") != std::string::npos) return;
    s.set(key, "1");
    told_ += "\n" + key + "\n";
  }

 private:
  const char *addr_var_, *port_var_;
  std::mutex mu_;
  std::shared_ptr<TcpStore> store_;
  std::string where_, told_;
};

// The round's store as chorusrun serves it, without the per-attempt prefix connect_store() adds:
// the keys are the launcher's.
StoreOf& round_store() {
  static StoreOf s("CHORUS_STORE_ADDR", "CHORUS_STORE_PORT");
  return s;
}
StoreOf& agent_store() {
  static StoreOf s("CHORUS_AGENT_ADDR", "CHORUS_AGENT_PORT");
  return s;
}

}  // namespace

bool launched() {
  const char* v = std::getenv("CHORUS_ELASTIC");
  return v && std::string(v) == "1";
}

int nodes_waiting(Communicator& comm) {
  if (!launched()) return 0;
  int64_t waiting = 0;
  if (comm.rank() == 0) {
    round_store().tell_once(kWatchingKey);
    Store& store = round_store().get();
    if (store.check({kWaitingKey})) waiting = std::stoll(store.get(kWaitingKey));
  }
  comm.broadcast(&waiting, 1, DataType::Int64, 0);
  return int(waiting);
}

void request_new_round(Communicator& comm) {
  if (!launched()) return;
  if (comm.rank() == 0) round_store().get().set(kReformKey, "1");
  comm.barrier();
}

void announce_in_process(Communicator& comm) {
  if (!launched()) return;
  // Every node's agent hears it from its own workers: the round's store is node 0's, which may
  // be the node that is lost before an agent has asked it.
  agent_store().tell_once(kInProcessKey);
  if (comm.rank() == 0) round_store().tell_once(kInProcessKey);
}

void ask_for_new_round(const std::string& why) {
  // The round it is in, so that the agent ignores a request a newer round already answered.
  if (launched()) agent_store().get().set(kRequestKey, env_or_throw("CHORUS_RESTART_COUNT") + " " + why);
}

namespace {
// This worker's place in the newest round its agent told it of: (round, the rest of the text).
std::pair<int, std::string> published_place() {
  const std::string key = worker_key(std::atoi(env_or_throw("CHORUS_LOCAL_RANK").c_str()));
  Store& agent = agent_store().get();
  if (!agent.check({key})) return {-1, ""};
  const std::string text = agent.get(key);
  return {std::atoi(text.c_str()), text};
}
}  // namespace

bool next_round_published() {
  if (!launched()) return false;
  return published_place().first > std::atoi(env_or_throw("CHORUS_RESTART_COUNT").c_str());
}

void await_next_round(std::chrono::milliseconds timeout) {
  const int current = std::atoi(env_or_throw("CHORUS_RESTART_COUNT").c_str());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      auto [round, text] = published_place();
      std::istringstream in(text);
      if (round > current) {
        std::string line;
        std::getline(in, line);
        while (std::getline(in, line)) {
          const size_t eq = line.find('=');
          if (eq != std::string::npos) setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
        }
        return;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(concat("chorus::elastic: no new round reached this worker within ", timeout.count(),
                                " ms (round ", current, " ended; is its chorusrun still running?)"),
                         {}, "elastic");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string trace_stamp() {
  static const bool on = [] {
    const char* v = std::getenv("CHORUS_ELASTIC_TRACE");
    return v && *v && *v != '0';
  }();
  if (!on) return "";
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return "[unix ms " + std::to_string(ms) + "] ";
}

}  // namespace chorus::elastic
