#include "engine/peer_watch.h"

#include "call_compare.h"
#include "chorus/core/error.h"

namespace chorus::engine {

using namespace std::chrono_literals;

namespace {
constexpr auto kBeat = 500ms;
constexpr int kBeatsToDeath = 5;  // a live rank on a loaded machine may miss one or two
}  // namespace

std::string WatchKeys::beat(int rank) { return detail::concat("beat/", rank); }
std::string WatchKeys::left(int rank) { return detail::concat("left/", rank); }
std::string WatchKeys::at(int rank) { return detail::concat("at/", rank); }
std::string WatchKeys::reached(uint64_t call, int rank) { return detail::concat("reached/", call, "/", rank); }

std::string PeerWatch::encode(const AbortRecord& r) {
  return detail::concat(r.from, "|", uint32_t(r.cause.kind), "|", r.cause.about, "|", r.cause.text);
}

std::optional<PeerWatch::AbortRecord> PeerWatch::decode(const std::string& s) {
  AbortRecord r;
  size_t a = s.find('|'), b = s.find('|', a + 1), c = s.find('|', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) return std::nullopt;
  r.from = std::stoi(s.substr(0, a));
  r.cause.kind = AbortKind(std::stoul(s.substr(a + 1, b - a - 1)));
  r.cause.about = std::stoi(s.substr(b + 1, c - b - 1));
  r.cause.text = s.substr(c + 1);
  return r;
}

PeerWatch::PeerWatch(Store& store, Engine& engine, int rank, int size, const BackendOptions& options)
    : store_(store), engine_(engine), rank_(rank), size_(size), group_(options.group_name), names_(options) {
  store_.add(WatchKeys::beat(rank_), 1);
  watchdog_ = std::thread([this] { watch(); });
}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  try {  // so that a peer waiting for this rank learns why it stopped answering
    store_.set(WatchKeys::left(rank_), std::to_string(calls_));
    store_.add(WatchKeys::kLeft, 1);
  } catch (const std::exception&) {
  }
}

uint64_t PeerWatch::begin_collective() {
  in_call_.store(++calls_, std::memory_order_release);
  return calls_;
}

// Note [Engine failures]: heartbeat, and interrupt the engine when a peer gave up.
void PeerWatch::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kBeat, [&] { return stopping_; })) {
    lock.unlock();
    try {
      store_.add(WatchKeys::beat(rank_), 1);
      // A rank that left before the collective this rank is in will never join it: an engine
      // that does not notice by itself (MPI) is interrupted.
      const uint64_t call = in_call_.load(std::memory_order_acquire);
      if (call && engine_.can_interrupt() && !left_before(call).empty()) engine_.interrupt();
      // A collective that lasts says so, for the timed_out() of a rank with a shorter deadline.
      if (call && call != announced_) {
        store_.set(WatchKeys::at(rank_), std::to_string(call));
        announced_ = call;
      }
      if (waiting_any_.load(std::memory_order_acquire) ? a_peer_stopped_beating() && engine_.can_interrupt()
                                                       : (still_.clear(), false))
        engine_.interrupt();  // the call fails, and diagnose() names the rank
      if (!peer_abort_ && store_.check({WatchKeys::kAbort})) {
        auto record = decode(store_.get(WatchKeys::kAbort));
        if (record && record->from != rank_) {
          {
            std::lock_guard<std::mutex> g(record_mu_);
            record_ = *record;
          }
          peer_abort_ = true;
          engine_.interrupt();
        }
      }
    } catch (const std::exception&) {
      // An unreachable store is reported by the calls that need it; keep beating.
    }
    lock.lock();
  }
}

bool PeerWatch::a_peer_stopped_beating() {
  if (still_.empty()) {
    last_beat_.assign(size_t(size_), -1);
    still_.assign(size_t(size_), 0);
  }
  bool stopped = false;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int64_t beat = store_.add(WatchKeys::beat(r), 0);
    still_[size_t(r)] = beat == last_beat_[size_t(r)] ? still_[size_t(r)] + 1 : 0;
    last_beat_[size_t(r)] = beat;
    stopped = stopped || still_[size_t(r)] >= kBeatsToDeath;
  }
  return stopped;
}

void PeerWatch::abort(const AbortCause& cause) {
  {
    std::lock_guard<std::mutex> g(record_mu_);
    self_cause_ = cause;
  }
  self_abort_ = true;
  engine_.interrupt();  // this rank's waits end now; telling the peers may take longer
  try {
    store_.compare_set(WatchKeys::kAbort, "", encode({rank_, cause}));
  } catch (const std::exception&) {
    // The store is gone with its host; the peers find out from the engine or their deadline.
  }
}

// The ranks that left the group (destroyed their communicator) having made fewer than `call`
// collectives: they will never take part in collective number `call`. A rank that left after
// finishing it does not count, as the others may still be finishing it too. The leavers'
// counter says when to look; each leaver's key is read once, by whichever thread asks first
// (the watchdog, or a call that failed).
std::vector<int> PeerWatch::left_before(uint64_t call) {
  std::lock_guard<std::mutex> lock(left_mu_);
  if (store_.add(WatchKeys::kLeft, 0) > int64_t(left_.size()))
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !left_.count(r) && store_.check({WatchKeys::left(r)}))
        left_[r] = std::stoull(store_.get(WatchKeys::left(r)));
  std::vector<int> out;
  for (const auto& [r, finished] : left_)
    if (finished < call) out.push_back(r);
  return out;
}

std::optional<PeerWatch::AbortRecord> PeerWatch::peer_abort() {
  if (!peer_abort_) return std::nullopt;
  std::lock_guard<std::mutex> g(record_mu_);
  return record_;
}

void PeerWatch::raise(const AbortRecord& r, const std::string& what) const {
  raise_peer_abort(r.cause, r.from, what, group_);
}

void PeerWatch::check_peers(const std::string& what) {
  if (auto record = peer_abort()) raise(*record, what);
}

void PeerWatch::diagnose(const Call& c, const std::string& engine_text) {
  const std::string what = detail::concat(describe(c), " (call #", calls_, ")");
  if (self_abort_) {  // this rank gave up: that is the error, no peer is to blame
    AbortCause cause;
    {
      std::lock_guard<std::mutex> g(record_mu_);
      cause = self_cause_;
    }
    raise_as(cause, cause.text, what);
  }
  try {  // the watchdog may not have seen the record yet
    if (!peer_abort_ && store_.check({WatchKeys::kAbort}))
      if (auto r = decode(store_.get(WatchKeys::kAbort)); r && r->from != rank_) raise(*r, what);
  } catch (const StoreError&) {
  }
  check_peers(what);
  if (Clock::now() >= c.deadline) timed_out(c, what);
  // The ranks the watchdog interrupts for (for point to point, any that left).
  const bool p2p = point_to_point(c.kind);
  std::vector<int> left;
  try {
    left = left_before(p2p ? UINT64_MAX : calls_);
  } catch (const StoreError&) {
  }
  if (!left.empty())
    throw PeerFailure(detail::concat(names_.name_rank(left.front()), " left group '", group_,
                                     "' (its communicator was destroyed) while rank ", rank_, " was in ", what),
                      left.front());
  std::vector<int> dead = stopped_beating();
  check_peers(what);
  if (self_abort_) diagnose(c, engine_text);  // gave up while watching: raises the cause
  if (dead.empty())
    throw PeerFailure(detail::concat(what, " on group '", group_, "' failed in ", engine_.name(), ": ", engine_text),
                      -1);
  std::string who;
  for (int d : dead) who += (who.empty() ? "" : ", ") + names_.name_rank(d);
  throw PeerFailure(detail::concat(what, " on group '", group_, "': ", who, " stopped responding (no heartbeat for ",
                                   kBeatsToDeath * kBeat.count(), " ms; ", engine_.name(), " said: ", engine_text, ")"),
                    dead.front());
}

// Ranks whose heartbeat does not move for kBeatsToDeath beats.
std::vector<int> PeerWatch::stopped_beating() {
  std::vector<int64_t> before(size_t(size_), -1);
  try {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) before[size_t(r)] = store_.add(WatchKeys::beat(r), 0);
    // Watching for kBeatsToDeath beats, unless this rank gives up meanwhile (its launcher formed
    // a new group, say): then nobody is to blame and the wait would only delay the recovery.
    const auto until = Clock::now() + kBeatsToDeath * kBeat;
    while (Clock::now() < until && !self_abort_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (self_abort_) return {};
    std::vector<int> dead;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && store_.add(WatchKeys::beat(r), 0) == before[size_t(r)]) dead.push_back(r);
    return dead;
  } catch (const std::exception&) {
    return {};
  }
}

// Each rank that timed out says how far it got, and each watchdog says which call its rank has
// been in for a beat; the ranks that said neither are missing.
void PeerWatch::timed_out(const Call& c, const std::string& what) {
  std::vector<int> missing;
  if (c.kind == OpKind::RecvAny) {  // no message came from any of them
    for (int r = 0; r < size_; ++r)
      if (r != rank_) missing.push_back(r);
  } else if (point_to_point(c.kind)) {
    missing.push_back(c.root);
  } else {
    try {
      store_.set(WatchKeys::reached(calls_, rank_), "1");
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back(WatchKeys::reached(calls_, r));
      try {  // the others that time out in this call say so meanwhile
        store_.wait(keys, 2s);
      } catch (const StoreError&) {
      }
      auto reached = [&](int r) {
        if (store_.check({keys[size_t(r)]})) return true;
        return store_.check({WatchKeys::at(r)}) && std::stoull(store_.get(WatchKeys::at(r))) >= calls_;
      };
      for (int r = 0; r < size_; ++r)
        if (!reached(r)) missing.push_back(r);
    } catch (const std::exception&) {
    }
  }
  check_peers(what);
  const std::string list = list_ranks(missing);
  const auto waited = std::chrono::duration_cast<Millis>(c.deadline - c.start).count();
  throw TimeoutError(
      detail::concat(what, " on group '", group_, "': rank ", rank_, " waited ", waited, " ms for ",
                     missing.empty() ? std::string("the others") : (missing.size() == 1 ? "rank " : "ranks ") + list,
                     " to take part"),
      missing, describe(c));
}

}  // namespace chorus::engine
