// Failure detection for the engine backends: the counterpart of shm's PeerWatch (shm/peer_watch.h),
// which sees a peer die through its pid; an engine's peers may be on other hosts, so this one
// watches them through the group's store.
//
// Note [Engine failures]: engines report trouble as an error on the ranks that talked to the
// culprit, and otherwise wait until their timeout. To tell every rank within seconds, and to
// name the culprit:
//   - each rank's watchdog thread bumps a heartbeat key in the group's store every beat (500 ms)
//     and watches an abort record there; when another rank publishes one, the watchdog interrupts
//     the engine, and the call in progress raises the error the record describes;
//   - a rank whose engine call fails looks at the heartbeats: a rank whose heartbeat stopped
//     for five beats is dead (PeerFailure naming it); if the deadline passed instead, the
//     ranks that did not reach this call are named (TimeoutError);
//   - a rank whose communicator aborts publishes the record (first one wins);
//   - a rank whose communicator is destroyed says so, with how many collectives it made; a rank
//     waiting in a later collective is interrupted and names it.
// What an engine cannot do: without interrupt(), ranks that never talked to the culprit wait
// until their deadline; and if the rank hosting the store dies, its heartbeat cannot be read,
// so it is named only by the engine's own message.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "abort_cause.h"
#include "backend.h"
#include "call.h"
#include "chorus/core/store.h"
#include "engine/engine.h"

namespace chorus::engine {

// Every key failure detection keeps in the group's store (a store of this group only).
struct WatchKeys {
  static std::string beat(int rank);                    // bumped every beat while the rank lives
  static constexpr const char* kAbort = "abort";        // the first abort record: "from|kind|about|text"
  static constexpr const char* kLeft = "left";          // how many ranks have left
  static std::string left(int rank);                    // collectives the rank had made when it left
  static std::string at(int rank);                      // the latest collective the rank was in for a beat
  static std::string reached(uint64_t call, int rank);  // the rank timed out in that collective
};

class PeerWatch {
 public:
  // Starts the watchdog thread of rank `rank` of `size`, on `engine` (which it interrupts).
  PeerWatch(Store& store, Engine& engine, int rank, int size, const BackendOptions& options);
  ~PeerWatch();  // stops the watchdog; records that this rank left, after how many collectives
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Numbers this rank's next collective (1, 2, ...) and tells the watchdog this rank is in it
  // until end_collective().
  uint64_t begin_collective();
  void end_collective() { in_call_.store(0, std::memory_order_release); }
  // While this rank receives from any rank (which no single connection's error ends), the
  // watchdog also reads the peers' heartbeats, and interrupts the engine when one stops.
  void begin_wait_any() { waiting_any_.store(true, std::memory_order_release); }
  void end_wait_any() { waiting_any_.store(false, std::memory_order_release); }
  uint64_t collectives() const { return calls_; }

  // Throws the error of a peer's abort record, when the watchdog has seen one.
  void check_peers(const std::string& what);
  // The same, building the call's name (`what()`) only when there is an error to raise: every
  // call checks, and a name built each time cost about 1% of a small call.
  template <class What>
  void check_peers_named_by(What&& what) {
    if (peer_abort_.load(std::memory_order_relaxed)) check_peers(what());
  }
  // The engine failed call `c` (`engine_text` is what it said): throws what happened, naming the
  // culprit: a peer's abort, the deadline (TimeoutError with the missing ranks), a rank that
  // left, or ranks whose heartbeat stopped.
  [[noreturn]] void diagnose(const Call& c, const std::string& engine_text);
  // Interrupts the engine, and publishes this rank's abort for the peers (first record wins). A
  // call it interrupts raises the cause at once, without looking for a peer to blame.
  void abort(const AbortCause& cause);

 private:
  struct AbortRecord {  // a rank's abort as the store keeps it
    int from = -1;      // the rank that gave up
    AbortCause cause;
  };
  static std::string encode(const AbortRecord& r);
  static std::optional<AbortRecord> decode(const std::string& s);

  void watch();
  bool a_peer_stopped_beating();  // watch()'s check while waiting_any_
  std::vector<int> left_before(uint64_t call);
  std::optional<AbortRecord> peer_abort();
  [[noreturn]] void raise(const AbortRecord& r, const std::string& what) const;
  std::vector<int> stopped_beating();
  [[noreturn]] void timed_out(const Call& c, const std::string& what);

  Store& store_;
  Engine& engine_;
  const int rank_, size_;
  const std::string group_;
  const BackendOptions names_;        // name_rank(): how messages name a peer
  uint64_t calls_ = 0;                // collectives begun
  std::atomic<uint64_t> in_call_{0};  // the collective in progress (its number), or 0
  std::atomic<bool> waiting_any_{false};
  std::vector<int64_t> last_beat_;  // watch(), while waiting_any_: each peer's last heartbeat
  std::vector<int> still_;          // and for how many beats it has not moved
  uint64_t announced_ = 0;          // the last collective watch() said this rank was in

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> peer_abort_{false};
  std::atomic<bool> self_abort_{false};
  std::mutex record_mu_;
  AbortRecord record_;
  AbortCause self_cause_;  // this rank's abort (under record_mu_)
  std::mutex left_mu_;
  std::map<int, uint64_t> left_;  // ranks that left, and how many collectives they had made
  std::thread watchdog_;          // last: starts once everything above exists
};

}  // namespace chorus::engine
