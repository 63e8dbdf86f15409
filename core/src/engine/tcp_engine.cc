// The "tcp" engine: chorus's own sockets (Note [chorus's own TCP]) and its algorithms between
// hosts (Note [Algorithms between hosts]), each call's algorithm chosen by Note [Choosing an
// algorithm between hosts]. What auto runs between hosts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/core/settings.h"
#include "engine/engine.h"
#include "net/algorithms.h"
#include "net/cost_model.h"
#include "net/mesh.h"
#include "reduce/reduce_kernels.h"

namespace chorus {
namespace {

using Clock = std::chrono::steady_clock;

// A rank's buffers for one call, as the algorithms name them, over the mesh.
class MeshLinks : public net::Links {
 public:
  MeshLinks(net::Mesh& mesh, const void* in, void* out, std::vector<uint8_t>& tmp, Clock::time_point deadline,
            const Reduction* r = nullptr)
      : mesh_(mesh),
        in_(static_cast<uint8_t*>(const_cast<void*>(in))),
        out_(static_cast<uint8_t*>(out)),
        tmp_(tmp),
        deadline_(deadline),
        fold_(r ? &r->fold : nullptr),
        elem_(r ? r->elem() : 1) {}
  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  void exchange(const std::vector<net::Move>& moves) override {
    transfers_.clear();
    for (const auto& m : moves) {
      net::Transfer t;
      t.peer = m.peer;
      t.send = m.send;
      t.data = at(m.span);
      t.bytes = m.span.bytes;
      if (m.fold) t.fold = fold_, t.fold_into = at(m.into), t.fold_from = at(m.from), t.elem = elem_;
      transfers_.push_back(t);
    }
    mesh_.run(transfers_, deadline_);
  }
  void copy(net::Span from, net::Span to) override {
    if (at(from) != at(to) && from.bytes) std::memmove(at(to), at(from), from.bytes);
  }
  void fold(net::Span into, net::Span from, net::Span other) override {
    if (into.bytes) (*fold_)(at(into), at(from), at(other), into.bytes / elem_);
  }
  void reserve_tmp(size_t bytes) override {
    if (tmp_.size() < bytes) tmp_.resize(bytes);
  }
  // Out as separate blocks of `block` bytes (all_gather_to): spans of Out lie within one block.
  void scatter_out(const std::vector<void*>& outs, size_t block) {
    for (void* p : outs) out_blocks_.push_back(static_cast<uint8_t*>(p));
    block_ = block;
  }

 private:
  uint8_t* at(const net::Span& s) const {
    if (s.buf == net::Buf::Out && !out_blocks_.empty())
      return s.bytes ? out_blocks_[s.offset / block_] + s.offset % block_ : out_blocks_[0];
    uint8_t* base = s.buf == net::Buf::In ? in_ : s.buf == net::Buf::Out ? out_ : tmp_.data();
    return base ? base + s.offset : nullptr;
  }
  net::Mesh& mesh_;
  uint8_t *in_, *out_;
  std::vector<uint8_t>& tmp_;
  Clock::time_point deadline_;
  const Fold* fold_;
  size_t elem_;
  std::vector<uint8_t*> out_blocks_;
  size_t block_ = 1;
  std::vector<net::Transfer> transfers_;
};

class TcpEngine : public Engine {
 public:
  TcpEngine(Store& store, int rank, int size, const CrossOptions& cross, Millis left)
      : mesh_(store, rank, size, Clock::now() + left), forced_(net::parse_forced(cross.algorithm, "the algorithm")) {
    cost_ = cross.cost.empty() ? measure(Clock::now() + left) : net::parse_cost(cross.cost);
    // For the groups made from this one (Note [Hierarchy]: the slices between hosts choose alike).
    if (rank == 0) store.set("tcp/cost", net::cost_setting(cost_));
    if (rank == 0 && settings().log_level >= 1)
      std::fprintf(stderr, "[chorus] tcp, %d ranks: %s (%s)\n", size, net::describe_cost(cost_).c_str(),
                   cross.cost.empty() ? "measured" : "given");
  }

  std::string name() const override { return "tcp"; }
  const net::NetCost& cost() const { return cost_; }

  void barrier(Millis left) override {
    MeshLinks l(mesh_, nullptr, nullptr, tmp_, Clock::now() + left);
    net::barrier(l);
  }
  void all_reduce(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left, &r);
    net::all_reduce(l, count, r.elem(), pick(OpKind::AllReduce, count * r.elem()));
  }
  void reduce(const void* in, void* out, size_t count, const Reduction& r, int root, Millis left) override {
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left, &r);
    net::reduce(l, count, r.elem(), root);
  }
  void reduce_scatter(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left, &r);
    net::reduce_scatter(l, count, r.elem(), pick(OpKind::ReduceScatter, count * r.elem()));
  }
  void broadcast(void* buf, size_t bytes, int root, Millis left) override {
    MeshLinks l(mesh_, buf, buf, tmp_, Clock::now() + left);
    net::broadcast(l, bytes, root, pick(OpKind::Broadcast, bytes), net::chain_segments(bytes, mesh_.size(), cost_));
  }
  void all_gather(const void* in, void* out, size_t bytes, Millis left) override {
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left);
    net::all_gather(l, bytes, pick(OpKind::AllGather, bytes));
  }
  void all_gather_to(const void* in, const std::vector<void*>& outs, size_t bytes, Millis left) override {
    MeshLinks l(mesh_, in, nullptr, tmp_, Clock::now() + left);
    l.scatter_out(outs, bytes);  // block p of Out is outs[p]: no staging
    net::all_gather(l, bytes, pick(OpKind::AllGather, bytes));
  }

  // The uneven and rooted ones go straight between the pairs that have something to move.
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes, Millis left) override {
    std::vector<net::Move> moves;
    const auto offsets = offsets_of(bytes);
    const int me = mesh_.rank();
    for (int q = 0; q < mesh_.size(); ++q)
      if (q != me) {
        moves.push_back({q, true, {net::Buf::In, 0, bytes[size_t(me)]}, false, {}});
        moves.push_back({q, false, {net::Buf::Out, offsets[size_t(q)], bytes[size_t(q)]}, false, {}});
      }
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left);
    l.copy({net::Buf::In, 0, bytes[size_t(me)]}, {net::Buf::Out, offsets[size_t(me)], bytes[size_t(me)]});
    l.exchange(moves);
  }
  void gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root, Millis left) override {
    const int me = mesh_.rank();
    const auto offsets = offsets_of(bytes);
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left);
    std::vector<net::Move> moves;
    if (me != root) {
      moves.push_back({root, true, {net::Buf::In, 0, bytes[size_t(me)]}, false, {}});
    } else {
      l.copy({net::Buf::In, 0, bytes[size_t(me)]}, {net::Buf::Out, offsets[size_t(me)], bytes[size_t(me)]});
      for (int q = 0; q < mesh_.size(); ++q)
        if (q != me) moves.push_back({q, false, {net::Buf::Out, offsets[size_t(q)], bytes[size_t(q)]}, false, {}});
    }
    l.exchange(moves);
  }
  void scatter(const void* in, void* out, size_t bytes, int root, Millis left) override {
    const int me = mesh_.rank();
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left);
    std::vector<net::Move> moves;
    if (me != root) {
      moves.push_back({root, false, {net::Buf::Out, 0, bytes}, false, {}});
    } else {
      l.copy({net::Buf::In, size_t(me) * bytes, bytes}, {net::Buf::Out, 0, bytes});
      for (int q = 0; q < mesh_.size(); ++q)
        if (q != me) moves.push_back({q, true, {net::Buf::In, size_t(q) * bytes, bytes}, false, {}});
    }
    l.exchange(moves);
  }
  void all_to_all_v(const void* in, const std::vector<size_t>& send_bytes, void* out,
                    const std::vector<size_t>& recv_bytes, Millis left) override {
    const int me = mesh_.rank();
    const auto sent_at = offsets_of(send_bytes), got_at = offsets_of(recv_bytes);
    MeshLinks l(mesh_, in, out, tmp_, Clock::now() + left);
    l.copy({net::Buf::In, sent_at[size_t(me)], send_bytes[size_t(me)]},
           {net::Buf::Out, got_at[size_t(me)], recv_bytes[size_t(me)]});
    std::vector<net::Move> moves;
    for (int q = 0; q < mesh_.size(); ++q)
      if (q != me) {
        moves.push_back({q, true, {net::Buf::In, sent_at[size_t(q)], send_bytes[size_t(q)]}, false, {}});
        moves.push_back({q, false, {net::Buf::Out, got_at[size_t(q)], recv_bytes[size_t(q)]}, false, {}});
      }
    l.exchange(moves);
  }

  void send(const void* buf, size_t bytes, int dst, bool ack, Millis left) override {
    std::vector<net::Transfer> t(1);
    t[0].peer = dst, t[0].send = true, t[0].bytes = bytes;
    t[0].data = static_cast<uint8_t*>(const_cast<void*>(buf));
    t[0].channel = ack ? net::Channel::Reply : net::Channel::Data;
    mesh_.run(t, Clock::now() + left);
  }
  void recv(void* buf, size_t bytes, int src, bool ack, Millis left) override {
    std::vector<net::Transfer> t(1);
    t[0].peer = src, t[0].bytes = bytes, t[0].data = static_cast<uint8_t*>(buf);
    t[0].channel = ack ? net::Channel::Reply : net::Channel::Data;
    mesh_.run(t, Clock::now() + left);
  }
  int recv_any(void* buf, size_t bytes, Millis left) override {
    net::Transfer t;
    t.bytes = bytes, t.data = static_cast<uint8_t*>(buf), t.channel = net::Channel::Data;
    std::vector<int> peers;
    for (int q = 0; q < mesh_.size(); ++q)
      if (q != mesh_.rank()) peers.push_back(q);
    mesh_.run_any(t, peers, Clock::now() + left);
    return t.peer;
  }

  void interrupt() override { mesh_.interrupt(); }
  bool can_interrupt() const override { return true; }

 private:
  static std::vector<size_t> offsets_of(const std::vector<size_t>& bytes) {
    std::vector<size_t> at(bytes.size(), 0);
    for (size_t i = 1; i < bytes.size(); ++i) at[i] = at[i - 1] + bytes[i - 1];
    return at;
  }

  net::Algorithm pick(OpKind op, size_t bytes) const { return net::choose(op, bytes, mesh_.size(), cost_, forced_); }

  // Rank 0 and the first rank on another host (else rank 1) ping-pong, rank 0 times a fold, and
  // every rank takes rank 0's numbers (Note [Choosing an algorithm between hosts]).
  net::NetCost measure(Clock::time_point deadline) {
    net::NetCost c;
    const int me = mesh_.rank(), n = mesh_.size();
    if (n == 1) return c;
    int peer = 1;
    for (int q = 1; q < n; ++q)
      if (mesh_.host_of(q) != mesh_.host_of(0)) {
        peer = q;
        break;
      }
    auto round_trips = [&](size_t bytes, int times) {
      std::vector<uint8_t> buf(bytes);
      std::vector<double> rtt;
      for (int i = 0; i < times; ++i) {
        const auto start = Clock::now();
        std::vector<net::Transfer> t(1);
        t[0].bytes = bytes, t[0].data = buf.data();
        t[0].peer = me == 0 ? peer : 0;
        t[0].send = me == 0;
        mesh_.run(t, deadline);
        t[0].send = !t[0].send;
        mesh_.run(t, deadline);
        rtt.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::sort(rtt.begin(), rtt.end());
      return rtt[rtt.size() / 2];
    };
    double terms[4] = {c.alpha, c.beta, c.gamma, c.o};
    if (me == 0 || me == peer) {
      const double small = round_trips(8, 11) / 2, large = round_trips(1 << 20, 5) / 2;
      terms[0] = small;
      terms[1] = std::max(1e-12, (large - small) / double(1 << 20));
    }
    if (me == 0) {
      std::vector<float> a(1 << 18, 1.0f), b(1 << 18, 2.0f);
      const void* srcs[2] = {a.data(), b.data()};
      double best = 1;
      for (int i = 0; i < 3; ++i) {
        const auto start = Clock::now();
        reduce::reduce(DataType::Float32, ReduceOp::Sum, srcs, 2, a.data(), a.size());
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
      }
      terms[2] = std::max(1e-13, best / double(a.size() * sizeof(float)));
    }
    MeshLinks l(mesh_, terms, terms, tmp_, deadline);
    net::broadcast(l, sizeof terms, 0, net::Algorithm::Binomial);
    return {terms[0], terms[1], terms[2], terms[3]};
  }

  net::Mesh mesh_;
  std::map<std::string, std::string> forced_;
  net::NetCost cost_;
  std::vector<uint8_t> tmp_;
};

}  // namespace

std::unique_ptr<Engine> make_tcp_engine(Store& store, int rank, int size, const CrossOptions& cross, Millis left) {
  return std::make_unique<TcpEngine>(store, rank, size, cross, left);
}

}  // namespace chorus
