// EngineBackend: the chorus contract on top of an Engine: the call comparison, dtype handling
// (f16/bf16 widened to f32, mean divided once), dispatch of each call to the engine's primitives,
// and point to point with a matching check. Failure detection is engine/peer_watch.h's.
#include "engine/engine.h"
#include "engine/peer_watch.h"

#include <cstdint>
#include <cstring>

#include "abort_cause.h"
#include "call_compare.h"
#include "chorus/core/error.h"
#include "reduce/half.h"
#include "reduce/reduce_kernels.h"

namespace chorus {
namespace {

bool is_half(DataType dt) { return dt == DataType::Float16 || dt == DataType::BFloat16; }

// 16-bit floats reduce in f32 on this path: widened on the way in, rounded once on the way out.
std::vector<float> widen(DataType dt, const void* src, size_t n) {
  std::vector<float> v(n);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i)
    v[i] = dt == DataType::Float16 ? reduce::half_to_float(s[i]) : reduce::bf16_to_float(s[i]);
  return v;
}
void narrow(DataType dt, const std::vector<float>& v, void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < v.size(); ++i)
    d[i] = dt == DataType::Float16 ? reduce::float_to_half(v[i]) : reduce::float_to_bf16(v[i]);
}

class EngineBackend : public Backend {
 public:
  EngineBackend(std::unique_ptr<Engine> engine, Store& store, int rank, int size, const BackendOptions& options)
      : engine_(std::move(engine)),
        rank_(rank),
        size_(size),
        group_(options.group_name),
        watch_(store, *engine_, rank, size, options) {}

  std::string name() const override { return engine_->name(); }

  void run(const Call& c) override {
    watch_.check_peers_named_by([&] { return describe(c); });
    try {
      if (chorus::point_to_point(c.kind)) return point_to_point(c);
      watch_.begin_collective();
      struct InCall {  // the watchdog knows which collective this rank is in, until it returns
        engine::PeerWatch& watch;
        ~InCall() { watch.end_collective(); }
      } in_call{watch_};
      if (!c.compared) compare(c);
      if (!c.compare_only) dispatch(c);
    } catch (const EngineFailure& e) {
      watch_.diagnose(c, e.what());
    }
  }

  void abort(const std::exception_ptr& cause) override { watch_.abort(abort_cause(cause)); }

 private:
  // Note [Comparing calls]: one max-reduction of (fingerprint, ~fingerprint, rejected) tells every
  // rank at once whether all made the same valid call (max == min); only when not, or for
  // all_to_all_v, whose counts must be compared pairwise, do the whole records travel.
  void compare(const Call& c) {
    const CallDesc d = make_desc(c, watch_.collectives());
    const auto counts = travelling_counts(c);
    if (c.kind != OpKind::AllToAllV) {
      const auto f = int64_t(fingerprint(d, counts));
      int64_t* v = compare_fingerprint_;  // a member, like the records below
      v[0] = f, v[1] = ~f, v[2] = d.invalid;
      engine_->all_reduce(v, v, 3, reduction_for(DataType::Int64, ReduceOp::Max), left_until(c.deadline));
      if (v[0] == ~v[1] && v[2] == 0) return;
    }
    const size_t counts_bytes = 2 * size_t(size_) * sizeof(uint64_t);
    const size_t record = sizeof(CallDesc) + kTextBytes + counts_bytes;
    // Members, not locals: an engine that cannot cancel a call it gave up on (MPI) may still
    // write into them if a late rank arrives.
    std::vector<uint8_t>& mine = compare_mine_;
    std::vector<uint8_t>& all = compare_all_;
    mine.assign(record, 0);
    all.resize(record * size_t(size_));
    std::memcpy(mine.data(), &d, sizeof d);
    put_text(reinterpret_cast<char*>(mine.data() + sizeof d), c.invalid);
    if (!counts.empty())  // (memcpy from an empty vector's null data() is undefined)
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
    compare_calls(calls, rank_, watch_.collectives(), group_);
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
    if (c.kind == OpKind::AllReduce)
      engine_->all_reduce(in, out, out_n, r, left);
    else if (c.kind == OpKind::Reduce)
      engine_->reduce(in, out, out_n, r, c.root, left);
    else
      engine_->reduce_scatter(in, out, out_n, r, left);
    if (!gets) return;
    if (c.op == ReduceOp::Mean) divide(dt, out, out_n);
    if (is_half(c.dtype))
      narrow(c.dtype, wide_out, c.out);
    else if (out != c.out)
      std::memcpy(c.out, out, out_n * element_size(dt));
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
        if (!c.outs.empty()) return engine_->all_gather_to(in, c.outs, bytes, left);
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
        // Uneven: a rank that moves nothing still takes part (the others' engine may exchange
        // empty messages with it); even: nothing moves anywhere.
        if (c.kind == OpKind::AllToAll && total_in == 0) return;
        if (in == out) in = private_input(total_in);
        return engine_->all_to_all_v(in, sends, out, recvs, left);
      }
      case OpKind::Send:
      case OpKind::Recv:
      case OpKind::RecvAny: break;
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
        throw CollectiveMismatch(
            detail::concat("send(", to_string(c.dtype), " x ", c.count, ", tag ", c.tag, ") to rank ", c.root,
                           " on group '", group_, "': the receiver expected a different message"),
            {});
      if (bytes) engine_->send(c.in, bytes, c.root, false, left_until(c.deadline));
      return;
    }
    P2PHeader theirs{};
    int src = c.root;
    if (c.kind == OpKind::RecvAny) {  // the first header to arrive names the sender; the rest is from it
      struct WaitingAny {
        engine::PeerWatch& watch;
        ~WaitingAny() { watch.end_wait_any(); }
      } waiting{watch_};
      watch_.begin_wait_any();
      src = engine_->recv_any(&theirs, sizeof theirs, left_until(c.deadline));
    } else
      engine_->recv(&theirs, sizeof theirs, src, false, left_until(c.deadline));
    verdict = theirs.count == mine.count && theirs.tag == mine.tag && theirs.dtype == mine.dtype;
    engine_->send(&verdict, 1, src, true, left_until(c.deadline));
    if (!verdict)
      throw CollectiveMismatch(
          detail::concat("recv(", to_string(c.dtype), " x ", c.count, ", tag ", c.tag, ") from rank ", src,
                         " on group '", group_, "': the message is ", to_string(DataType(theirs.dtype)), " x ",
                         theirs.count, ", tag ", theirs.tag),
          {});
    if (bytes) engine_->recv(c.out, bytes, src, false, left_until(c.deadline));
    if (c.source) *c.source = src;
  }

  std::unique_ptr<Engine> engine_;
  const int rank_, size_;
  const std::string group_;
  int64_t compare_fingerprint_[3] = {};
  std::vector<uint8_t> compare_mine_, compare_all_;
  engine::PeerWatch watch_;  // after engine_: stops watching before the engine goes
};

}  // namespace

std::unique_ptr<Backend> make_engine_backend(std::unique_ptr<Engine> engine, Store& store, int rank, int size,
                                             const BackendOptions& options) {
  return std::make_unique<EngineBackend>(std::move(engine), store, rank, size, options);
}

}  // namespace chorus
