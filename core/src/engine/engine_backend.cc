// EngineBackend: the chorus contract on top of an Engine.
//
// Note [Engine failures]: engines report trouble as an error on the ranks that talked to the
// culprit, and otherwise wait until their timeout. To tell every rank within seconds, and to
// name the culprit:
//   - each rank's watchdog thread bumps a heartbeat key in the group's store every 500 ms and
//     watches an abort record there; when another rank publishes one, the watchdog interrupts
//     the engine, and the call in progress raises the error the record describes;
//   - a rank whose engine call fails looks at the heartbeats: a rank whose heartbeat stopped
//     for 2.5 seconds is dead (PeerFailure naming it); if the deadline passed instead, the
//     ranks that did not reach this call are named (TimeoutError);
//   - a rank whose communicator aborts publishes the record (first one wins);
//   - a rank whose communicator is destroyed says so, with how many collectives it made; a rank
//     waiting in a later collective is interrupted and names it.
// What an engine cannot do: without interrupt(), ranks that never talked to the culprit wait
// until their deadline; and if the rank hosting the store dies, its heartbeat cannot be read,
// so it is named only by the engine's own message.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "abort_cause.h"
#include "call_check.h"
#include "chorus/core/error.h"
#include "chorus/core/store.h"
#include "reduce/half.h"
#include "reduce/reduce_kernels.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

constexpr auto kBeat = 500ms;

// A rank's abort as the store keeps it: "from|kind|about|text".
struct AbortRecord {
  int from = -1;  // the rank that gave up
  AbortCause cause;
};

std::string encode(const AbortRecord& r) {
  return detail::concat(r.from, "|", uint32_t(r.cause.kind), "|", r.cause.about, "|", r.cause.text);
}

std::optional<AbortRecord> decode(const std::string& s) {
  AbortRecord r;
  size_t a = s.find('|'), b = s.find('|', a + 1), c = s.find('|', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) return std::nullopt;
  r.from = std::stoi(s.substr(0, a));
  r.cause.kind = AbortKind(std::stoul(s.substr(a + 1, b - a - 1)));
  r.cause.about = std::stoi(s.substr(b + 1, c - b - 1));
  r.cause.text = s.substr(c + 1);
  return r;
}

bool is_half(DataType dt) { return dt == DataType::Float16 || dt == DataType::BFloat16; }

// 16-bit floats reduce in f32 on this path: widened on the way in, rounded once on the way out.
std::vector<float> widen(DataType dt, const void* src, size_t n) {
  std::vector<float> v(n);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) v[i] = dt == DataType::Float16 ? reduce::half_to_float(s[i]) : reduce::bf16_to_float(s[i]);
  return v;
}
void narrow(DataType dt, const std::vector<float>& v, void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < v.size(); ++i) d[i] = dt == DataType::Float16 ? reduce::float_to_half(v[i]) : reduce::float_to_bf16(v[i]);
}

class EngineBackend : public Backend {
 public:
  EngineBackend(std::unique_ptr<Engine> engine, Store& store, int rank, int size, const BackendOptions& options)
      : engine_(std::move(engine)), store_(store), rank_(rank), size_(size), group_(options.group_name) {
    store_.add(beat_key(rank_), 1);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~EngineBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    try {  // so that a peer waiting for this rank learns why it stopped answering
      store_.set(detail::concat("left/", rank_), std::to_string(calls_));
      store_.add("left", 1);
    } catch (const std::exception&) {
    }
  }

  std::string name() const override { return engine_->name(); }

  void run(const Call& c) override {
    if (auto record = peer_abort()) from_record(*record, describe(c));
    try {
      if (c.kind == OpKind::Send || c.kind == OpKind::Recv) return point_to_point(c);
      ++calls_;
      struct InCall {  // tells the watchdog which collective this rank is in, until it returns
        std::atomic<uint64_t>& at;
        ~InCall() { at.store(0, std::memory_order_release); }
      } in_call{in_call_};
      in_call_.store(calls_, std::memory_order_release);
      if (!c.checked) check(c);
      if (!c.check_only) dispatch(c);
    } catch (const EngineFailure& e) {
      diagnose(c, e.what());
    }
  }

  void abort(const std::exception_ptr& cause) override {
    const AbortRecord r{rank_, abort_cause(cause)};
    try {
      store_.compare_set("abort", "", encode(r));
    } catch (const std::exception&) {
      // The store is gone with its host; the peers find out from the engine or their deadline.
    }
    engine_->interrupt();
  }

 private:
  static std::string beat_key(int r) { return detail::concat("beat/", r); }
  static std::string reached_key(uint64_t call, int r) { return detail::concat("reached/", call, "/", r); }
  static std::string at_key(int r) { return detail::concat("at/", r); }  // the latest call r was in for a beat

  // Note [Engine failures]: heartbeat, and interrupt the engine when a peer gave up.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, kBeat, [&] { return stopping_; })) {
      lock.unlock();
      try {
        store_.add(beat_key(rank_), 1);
        // A rank that left before the collective this rank is in will never join it: an engine
        // that does not notice by itself (MPI) is interrupted.
        const uint64_t call = in_call_.load(std::memory_order_acquire);
        if (call && engine_->can_interrupt() && !left_before(call).empty()) engine_->interrupt();
        // A collective that lasts says so, for the timed_out() of a rank with a shorter deadline.
        if (call && call != announced_) {
          store_.set(at_key(rank_), std::to_string(call));
          announced_ = call;
        }
        if (!peer_abort_ && store_.check({"abort"})) {
          auto record = decode(store_.get("abort"));
          if (record && record->from != rank_) {
            {
              std::lock_guard<std::mutex> g(record_mu_);
              record_ = *record;
            }
            peer_abort_ = true;
            engine_->interrupt();
          }
        }
      } catch (const std::exception&) {
        // An unreachable store is reported by the calls that need it; keep beating.
      }
      lock.lock();
    }
  }

  // The ranks that left the group (destroyed their communicator) having made fewer than `call`
  // collectives: they will never take part in collective number `call`. A rank that left after
  // finishing it does not count, as the others may still be finishing it too. The leavers'
  // counter says when to look; each leaver's key is read once, by whichever thread asks first
  // (the watchdog, or a call that failed).
  std::vector<int> left_before(uint64_t call) {
    std::lock_guard<std::mutex> lock(left_mu_);
    if (store_.add("left", 0) > int64_t(left_.size()))
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && !left_.count(r) && store_.check({detail::concat("left/", r)}))
          left_[r] = std::stoull(store_.get(detail::concat("left/", r)));
    std::vector<int> out;
    for (const auto& [r, finished] : left_)
      if (finished < call) out.push_back(r);
    return out;
  }

  std::optional<AbortRecord> peer_abort() {
    if (!peer_abort_) return std::nullopt;
    std::lock_guard<std::mutex> g(record_mu_);
    return record_;
  }

  [[noreturn]] void from_record(const AbortRecord& r, const std::string& what) const {
    raise_peer_abort(r.cause, r.from, what, group_);
  }

  // The call failed in the engine: a peer gave up, died, or did not arrive in time.
  [[noreturn]] void diagnose(const Call& c, const std::string& engine_text) {
    const std::string what = detail::concat(describe(c), " (call #", calls_, ")");
    try {  // the watchdog may not have seen the record yet
      if (!peer_abort_ && store_.check({"abort"}))
        if (auto r = decode(store_.get("abort")); r && r->from != rank_) from_record(*r, what);
    } catch (const StoreError&) {
    }
    if (auto r = peer_abort()) from_record(*r, what);
    if (Clock::now() >= c.deadline) timed_out(c, what);
    // The ranks the watchdog interrupts for (for point to point, any that left).
    const bool p2p = c.kind == OpKind::Send || c.kind == OpKind::Recv;
    std::vector<int> left;
    try {
      left = left_before(p2p ? UINT64_MAX : calls_);
    } catch (const StoreError&) {
    }
    if (!left.empty())
      throw PeerFailure(detail::concat("rank ", left.front(), " left group '", group_,
                                       "' (its communicator was destroyed) while rank ", rank_, " was in ", what),
                        left.front());
    std::vector<int> dead = stopped_beating();
    if (auto r = peer_abort()) from_record(*r, what);
    if (dead.empty())
      throw PeerFailure(detail::concat(what, " on group '", group_, "' failed in ", engine_->name(), ": ", engine_text),
                        -1);
    throw PeerFailure(detail::concat(what, " on group '", group_, "': ", dead.size() == 1 ? "rank " : "ranks ",
                                     list_ranks(dead),
                                     " stopped responding (no heartbeat for ", 5 * kBeat.count(), " ms; ",
                                     engine_->name(), " said: ", engine_text, ")"),
                      dead.front());
  }

  // Ranks whose heartbeat does not move for five beats (a live rank on a loaded machine may miss
  // one or two).
  std::vector<int> stopped_beating() {
    std::vector<int64_t> before(size_t(size_), -1);
    try {
      for (int r = 0; r < size_; ++r)
        if (r != rank_) before[size_t(r)] = store_.add(beat_key(r), 0);
      std::this_thread::sleep_for(5 * kBeat);
      std::vector<int> dead;
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && store_.add(beat_key(r), 0) == before[size_t(r)]) dead.push_back(r);
      return dead;
    } catch (const std::exception&) {
      return {};
    }
  }

  // Each rank that timed out says how far it got, and each watchdog says which call its rank has
  // been in for a beat; the ranks that said neither are missing.
  [[noreturn]] void timed_out(const Call& c, const std::string& what) {
    std::vector<int> missing;
    if (c.kind == OpKind::Send || c.kind == OpKind::Recv) {
      missing.push_back(c.root);
    } else {
      try {
        store_.set(reached_key(calls_, rank_), "1");
        std::vector<std::string> keys;
        for (int r = 0; r < size_; ++r) keys.push_back(reached_key(calls_, r));
        try {  // the others that time out in this call say so meanwhile
          store_.wait(keys, 2s);
        } catch (const StoreError&) {
        }
        auto reached = [&](int r) {
          if (store_.check({keys[size_t(r)]})) return true;
          return store_.check({at_key(r)}) && std::stoull(store_.get(at_key(r))) >= calls_;
        };
        for (int r = 0; r < size_; ++r)
          if (!reached(r)) missing.push_back(r);
      } catch (const std::exception&) {
      }
    }
    if (auto r = peer_abort()) from_record(*r, what);
    const std::string list = list_ranks(missing);
    const auto waited = std::chrono::duration_cast<Millis>(c.deadline - c.start).count();
    throw TimeoutError(detail::concat(what, " on group '", group_, "': rank ", rank_, " waited ", waited,
                                      " ms for ", missing.empty() ? std::string("the others") : (missing.size() == 1 ? "rank " : "ranks ") + list,
                                      " to take part"),
                       missing, describe(c));
  }

  // Note [Call check]: one max-reduction of (fingerprint, ~fingerprint, rejected) tells every
  // rank at once whether all made the same valid call (max == min); only when not, or for
  // all_to_all_v, whose counts must be compared pairwise, do the whole records travel.
  void check(const Call& c) {
    const CallDesc d = make_desc(c, calls_);
    const auto counts = travelling_counts(c);
    if (c.kind != OpKind::AllToAllV) {
      const auto f = int64_t(fingerprint(d, counts));
      int64_t* v = check_fingerprint_;  // a member, like the records below
      v[0] = f, v[1] = ~f, v[2] = d.invalid;
      engine_->all_reduce(v, v, 3, reduction_for(DataType::Int64, ReduceOp::Max), left_until(c.deadline));
      if (v[0] == ~v[1] && v[2] == 0) return;
    }
    const size_t counts_bytes = 2 * size_t(size_) * sizeof(uint64_t);
    const size_t record = sizeof(CallDesc) + kTextBytes + counts_bytes;
    // Members, not locals: an engine that cannot cancel a call it gave up on (MPI) may still
    // write into them if a late rank arrives.
    std::vector<uint8_t>& mine = check_mine_;
    std::vector<uint8_t>& all = check_all_;
    mine.assign(record, 0);
    all.resize(record * size_t(size_));
    std::memcpy(mine.data(), &d, sizeof d);
    put_text(reinterpret_cast<char*>(mine.data() + sizeof d), c.invalid);
    std::memcpy(mine.data() + sizeof d + kTextBytes, counts.data(), counts.size() * sizeof(uint64_t));
    engine_->all_gather(mine.data(), all.data(), record, left_until(c.deadline));
    std::vector<RankCall> calls;
    for (int p = 0; p < size_; ++p) {
      const uint8_t* r = all.data() + size_t(p) * record;
      CallDesc pd;
      std::memcpy(&pd, r, sizeof pd);
      calls.push_back({pd, reinterpret_cast<const uint64_t*>(r + sizeof pd + kTextBytes),
                       reinterpret_cast<const char*>(r + sizeof pd)});
    }
    check_calls(calls, rank_, calls_, group_);
  }

  Reduction reduction_for(DataType dt, ReduceOp op) const {
    const ReduceOp pairwise = op == ReduceOp::Mean ? ReduceOp::Sum : op;  // divided once at the end
    return {dt, pairwise, [dt, pairwise](void* out, const void* a, const void* b, size_t n) {
              const void* srcs[2] = {a, b};
              reduce::reduce(dt, pairwise, srcs, 2, out, n);
            }};
  }

  void divide(DataType dt, void* buf, size_t n) const {
    if (dt == DataType::Float64)
      for (size_t i = 0; i < n; ++i) static_cast<double*>(buf)[i] /= double(size_);
    else
      for (size_t i = 0; i < n; ++i) static_cast<float*>(buf)[i] /= float(size_);
  }

  // all_reduce, reduce or reduce_scatter: in the widened type where needed, through a scratch
  // output where this rank gets none or the output overlaps the input, then mean's division.
  void reduction(const Call& c) {
    const size_t out_n = c.count, in_n = c.kind == OpKind::ReduceScatter ? c.count * size_t(size_) : c.count;
    const bool gets = c.kind != OpKind::Reduce || rank_ == c.root;
    DataType dt = c.dtype;
    const void* in = c.in;
    void* out = c.out;
    std::vector<float> wide_in, wide_out;
    std::vector<uint8_t> scratch;
    if (is_half(dt)) {
      wide_in = widen(dt, in, in_n);
      wide_out.resize(out_n);
      in = wide_in.data();
      out = wide_out.data();
      dt = DataType::Float32;
    } else if (!gets || (c.kind == OpKind::ReduceScatter &&
                         out == static_cast<const uint8_t*>(in) + size_t(rank_) * out_n * element_size(dt))) {
      // engines reduce through an output on every rank, and reduce_scatter's in-place output
      // lies inside its input
      scratch.resize(out_n * element_size(dt));
      out = scratch.data();
    }
    const Reduction r = reduction_for(dt, c.op);
    const Millis left = left_until(c.deadline);
    if (c.kind == OpKind::AllReduce) engine_->all_reduce(in, out, out_n, r, left);
    else if (c.kind == OpKind::Reduce) engine_->reduce(in, out, out_n, r, c.root, left);
    else engine_->reduce_scatter(in, out, out_n, r, left);
    if (!gets) return;
    if (c.op == ReduceOp::Mean) divide(dt, out, out_n);
    if (is_half(c.dtype)) narrow(c.dtype, wide_out, c.out);
    else if (out != c.out) std::memcpy(c.out, out, out_n * element_size(dt));
  }

  void dispatch(const Call& c) {
    const size_t es = element_size(c.dtype);
    const size_t bytes = c.count * es;
    const Millis left = left_until(c.deadline);
    const auto* in = static_cast<const uint8_t*>(c.in);
    auto* out = static_cast<uint8_t*>(c.out);
    const size_t W = size_t(size_);
    auto scaled = [&](const std::vector<uint64_t>& v) {
      std::vector<size_t> b;
      for (uint64_t n : v) b.push_back(size_t(n) * es);
      return b;
    };
    // In-place forms (Communicator's conventions) go through a copy of the input.
    std::vector<uint8_t> copy;
    auto private_input = [&](size_t n) {
      copy.assign(in, in + n);
      return copy.data();
    };
    switch (c.kind) {
      case OpKind::Barrier:
      case OpKind::Split:
      case OpKind::AllocSymmetric: return engine_->barrier(left);
      case OpKind::AllReduce:
      case OpKind::Reduce:
      case OpKind::ReduceScatter:
        if (c.count) reduction(c);
        return;
      case OpKind::Broadcast:
        if (bytes) engine_->broadcast(out, bytes, c.root, left);
        return;
      case OpKind::AllGather:
        if (!bytes) return;
        if (in == out + size_t(rank_) * bytes) in = private_input(bytes);
        return engine_->all_gather(in, out, bytes, left);
      case OpKind::AllGatherV:
      case OpKind::Gather:
      case OpKind::GatherV: {
        const auto sizes = c.kind == OpKind::Gather ? std::vector<size_t>(W, bytes) : scaled(c.counts);
        size_t mine = sizes[size_t(rank_)], disp = 0, total = 0;
        for (int p = 0; p < size_; ++p) (p < rank_ ? disp : total) += sizes[size_t(p)];
        total += disp;
        if (total == 0) return;
        if (out && in == out + disp && mine) in = private_input(mine);
        if (c.kind == OpKind::AllGatherV) return engine_->all_gather_v(in, out, sizes, left);
        return engine_->gather_v(in, out, sizes, c.root, left);
      }
      case OpKind::Scatter:
        if (!bytes) return;
        if (rank_ == c.root && out == in + size_t(rank_) * bytes) {
          std::vector<uint8_t> mine(out, out + bytes);
          engine_->scatter(in, mine.data(), bytes, c.root, left);
          std::memcpy(out, mine.data(), bytes);
          return;
        }
        return engine_->scatter(in, out, bytes, c.root, left);
      case OpKind::AllToAll:
      case OpKind::AllToAllV: {
        const auto sends = c.kind == OpKind::AllToAll ? std::vector<size_t>(W, bytes) : scaled(c.counts);
        const auto recvs = c.kind == OpKind::AllToAll ? std::vector<size_t>(W, bytes) : scaled(c.recv_counts);
        size_t total_in = 0, total_out = 0;
        for (size_t p = 0; p < W; ++p) total_in += sends[p], total_out += recvs[p];
        if (total_in == 0 && total_out == 0) return;
        if (in == out) in = private_input(total_in);
        return engine_->all_to_all_v(in, sends, out, recvs, left);
      }
      case OpKind::Send:
      case OpKind::Recv: break;
    }
  }

  // A message is a header (what the sender called) and then the data; the receiver answers with
  // one byte that says whether its call matched, so that a mismatch raises on both ends.
  struct P2PHeader {
    uint64_t count;
    int32_t tag;
    uint8_t dtype, reserved[3];
  };

  void point_to_point(const Call& c) {
    if (!c.invalid.empty()) throw InvalidArgument(c.invalid);
    const size_t bytes = c.count * element_size(c.dtype);
    P2PHeader mine{c.count, c.tag, uint8_t(c.dtype), {}};
    uint8_t verdict = 1;
    if (c.kind == OpKind::Send) {
      engine_->send(&mine, sizeof mine, c.root, false, left_until(c.deadline));
      engine_->recv(&verdict, 1, c.root, true, left_until(c.deadline));
      if (!verdict)
        throw CollectiveMismatch(detail::concat("send(", to_string(c.dtype), " x ", c.count, ", tag ", c.tag,
                                                ") to rank ", c.root, " on group '", group_,
                                                "': the receiver expected a different message"),
                                 {});
      if (bytes) engine_->send(c.in, bytes, c.root, false, left_until(c.deadline));
      return;
    }
    P2PHeader theirs{};
    engine_->recv(&theirs, sizeof theirs, c.root, false, left_until(c.deadline));
    verdict = theirs.count == mine.count && theirs.tag == mine.tag && theirs.dtype == mine.dtype;
    engine_->send(&verdict, 1, c.root, true, left_until(c.deadline));
    if (!verdict)
      throw CollectiveMismatch(
          detail::concat("recv(", to_string(c.dtype), " x ", c.count, ", tag ", c.tag, ") from rank ", c.root,
                         " on group '", group_, "': the message is ", to_string(DataType(theirs.dtype)), " x ",
                         theirs.count, ", tag ", theirs.tag),
          {});
    if (bytes) engine_->recv(c.out, bytes, c.root, false, left_until(c.deadline));
  }

  std::unique_ptr<Engine> engine_;
  Store& store_;
  const int rank_, size_;
  const std::string group_;
  uint64_t calls_ = 0;
  int64_t check_fingerprint_[3] = {};
  std::vector<uint8_t> check_mine_, check_all_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread watchdog_;
  std::atomic<bool> peer_abort_{false};
  std::atomic<uint64_t> in_call_{0};  // the collective in progress (its number), or 0
  uint64_t announced_ = 0;             // the last collective watch() said this rank was in
  std::mutex left_mu_;
  std::map<int, uint64_t> left_;      // ranks that left, and how many collectives they had made
  std::mutex record_mu_;
  AbortRecord record_;
};

}  // namespace

std::unique_ptr<Backend> make_engine_backend(std::unique_ptr<Engine> engine, Store& store, int rank, int size,
                                             const BackendOptions& options) {
  return std::make_unique<EngineBackend>(std::move(engine), store, rank, size, options);
}

}  // namespace chorus
