// The collective sweep (every collective, dtype and op, in place and not, each rank checking
// against a reference computed here), shared by the gtest suite and the multi-host probe.
#pragma once

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "multiprocess.h"
#include "test_values.h"

namespace chorus::test {

struct SweepConfig {
  std::string backend;
  int world;
  size_t chunk_bytes;  // 0: default
  std::vector<size_t> counts;
  bool one_core = false;             // every rank pinned to one CPU: each wait is on a rank that ran there
  std::optional<bool> stream_slots;  // CommunicatorOptions::shm.stream_slots
  std::string cross_algorithm;       // CommunicatorOptions::cross.algorithm (tcp)
  std::string label;                 // names the test where the fields above do not
  // The types swept at counts over 100,000 (empty: every type). Each type's fold and each
  // collective's handling of it are checked at the smaller counts, and in full at the large count
  // of the configurations that leave this empty; a configuration that tests something else at its
  // large count (the world's partition of the blocks, how the slots are stored into) needs one
  // type of each width.
  std::vector<DataType> large_types;
};
inline void PrintTo(const SweepConfig& c, std::ostream* os) {
  *os << c.backend << " W" << c.world << " chunk " << c.chunk_bytes << (c.one_core ? " one core" : "")
      << (c.stream_slots ? (*c.stream_slots ? " streamed slots" : " normal slots") : "")
      << (c.cross_algorithm.empty() ? "" : " algorithms " + c.cross_algorithm);
}

inline std::string label(const char* op, DataType dt, size_t count, const char* extra = "") {
  return detail::concat(op, " ", to_string(dt), " x ", count, extra);
}

inline void check_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t count, DataType dt,
                        const std::string& what) {
  RANK_CHECK(got.size() >= count * element_size(dt), what, ": short output");
  std::string diff = compare_bytes(got.data(), want.data(), count, dt);
  RANK_CHECK(diff.empty(), what, ": ", diff);
}

// Per-rank counts for the uneven collectives: differ between ranks, some may be zero.
inline std::vector<size_t> uneven_counts(int world, size_t count) {
  std::vector<size_t> v;
  for (int p = 0; p < world; ++p) v.push_back(p % 3 == 1 ? count / 2 : count + size_t(p));
  return v;
}

inline void reductions(Communicator& comm, DataType dt, size_t count, uint64_t salt) {
  const int W = comm.size(), me = comm.rank();
  const size_t es = element_size(dt);
  for (ReduceOp op : kAllReduceOps) {
    if (!reduce_op_problem(dt, op).empty()) continue;
    auto gen = [&](int p, size_t i) { return value(dt, op, p, i, salt + uint64_t(op)); };
    auto mine = [&](size_t i) { return gen(me, i); };
    const auto want = reference_reduce(dt, op, W, count, gen);
    const std::string opname(to_string(op));

    auto in = make_buffer(dt, count, mine);
    std::vector<uint8_t> out(count * es);
    comm.all_reduce(in.data(), out.data(), count, dt, op);
    check_equal(out, want, count, dt, label("all_reduce", dt, count, (" " + opname).c_str()));
    comm.all_reduce(in.data(), in.data(), count, dt, op);
    check_equal(in, want, count, dt, label("all_reduce in place", dt, count, (" " + opname).c_str()));

    const int root = W - 1;
    in = make_buffer(dt, count, mine);
    std::vector<uint8_t> rout(me == root ? count * es : 0);
    comm.reduce(in.data(), me == root ? rout.data() : nullptr, count, dt, op, root);
    if (me == root) check_equal(rout, want, count, dt, label("reduce", dt, count, (" " + opname).c_str()));

    // reduce_scatter: W blocks of count; rank q gets block q reduced.
    auto gen_rs = [&](int p, size_t i) { return gen(p, i + size_t(me) * count); };
    const auto want_rs = reference_reduce(dt, op, W, count, gen_rs);
    auto big = make_buffer(dt, count * size_t(W), mine);
    std::vector<uint8_t> rs(count * es);
    comm.reduce_scatter(big.data(), rs.data(), count, dt, op);
    check_equal(rs, want_rs, count, dt, label("reduce_scatter", dt, count, (" " + opname).c_str()));
    comm.reduce_scatter(big.data(), big.data() + size_t(me) * count * es, count, dt, op);
    std::vector<uint8_t> own(big.begin() + ptrdiff_t(size_t(me) * count * es),
                             big.begin() + ptrdiff_t(size_t(me + 1) * count * es));
    check_equal(own, want_rs, count, dt, label("reduce_scatter in place", dt, count, (" " + opname).c_str()));
  }
}

inline void movements(Communicator& comm, DataType dt, size_t count, uint64_t salt) {
  const int W = comm.size(), me = comm.rank();
  const size_t es = element_size(dt);
  auto gen = [&](int p, size_t i) { return value(dt, ReduceOp::Sum, p, i, salt); };
  auto of = [&](int p) { return make_buffer(dt, count, [&](size_t i) { return gen(p, i); }); };
  auto concat_of = [&](const std::vector<size_t>& counts) {
    std::vector<uint8_t> all;
    for (int p = 0; p < W; ++p) {
      auto b = make_buffer(dt, counts[size_t(p)], [&](size_t i) { return gen(p, i); });
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  };

  // broadcast from every root in turn
  for (int root = 0; root < W; ++root) {
    auto buf = me == root ? of(root) : std::vector<uint8_t>(count * es, 0xAB);
    comm.broadcast(buf.data(), count, dt, root);
    check_equal(buf, of(root), count, dt, label("broadcast", dt, count, detail::concat(" root ", root).c_str()));
  }

  // all_gather, out of place and in place
  std::vector<size_t> even(size_t(W), count);
  const auto want = concat_of(even);
  std::vector<uint8_t> out(count * es * size_t(W), 0xCD);
  auto in = of(me);
  comm.all_gather(in.data(), out.data(), count, dt);
  check_equal(out, want, count * size_t(W), dt, label("all_gather", dt, count));
  std::vector<uint8_t> inplace(count * es * size_t(W), 0xCD);
  std::copy(in.begin(), in.end(), inplace.begin() + ptrdiff_t(size_t(me) * count * es));
  comm.all_gather(inplace.data() + size_t(me) * count * es, inplace.data(), count, dt);
  check_equal(inplace, want, count * size_t(W), dt, label("all_gather in place", dt, count));

  // gather to the last rank
  const int root = W - 1;
  std::vector<uint8_t> g(me == root ? count * es * size_t(W) : 0, 0xCD);
  comm.gather(in.data(), me == root ? g.data() : nullptr, count, dt, root);
  if (me == root) check_equal(g, want, count * size_t(W), dt, label("gather", dt, count));

  // uneven gathers
  const auto counts = uneven_counts(W, count);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  const auto want_v = concat_of(counts);
  auto vin = make_buffer(dt, counts[size_t(me)], [&](size_t i) { return gen(me, i); });
  std::vector<uint8_t> vout(total * es, 0xCD);
  comm.all_gather_v(vin.data(), vout.data(), counts, dt);
  check_equal(vout, want_v, total, dt, label("all_gather_v", dt, count));
  std::vector<uint8_t> gv(me == 0 ? total * es : 0, 0xCD);
  comm.gather_v(vin.data(), me == 0 ? gv.data() : nullptr, counts, dt, 0);
  if (me == 0) check_equal(gv, want_v, total, dt, label("gather_v", dt, count));

  // scatter from rank 0: block q is gen(q, ...) shifted
  auto scatter_src = me == 0 ? concat_of(even) : std::vector<uint8_t>();
  std::vector<uint8_t> sc(count * es, 0xCD);
  comm.scatter(me == 0 ? scatter_src.data() : nullptr, sc.data(), count, dt, 0);
  check_equal(sc, of(me), count, dt, label("scatter", dt, count));
  if (me == 0) {
    comm.scatter(scatter_src.data(), scatter_src.data(), count, dt, 0);  // in place on the root
    check_equal(scatter_src, of(0), count, dt, label("scatter in place", dt, count));
  } else {
    comm.scatter(nullptr, sc.data(), count, dt, 0);
    check_equal(sc, of(me), count, dt, label("scatter (second)", dt, count));
  }

  // all_to_all: element i of block q from rank p is gen(p * W + q, i)
  auto block = [&](int p, int q, size_t n) { return make_buffer(dt, n, [&](size_t i) { return gen(p * W + q, i); }); };
  std::vector<uint8_t> a2a_in, a2a_want;
  for (int q = 0; q < W; ++q) {
    auto b = block(me, q, count);
    a2a_in.insert(a2a_in.end(), b.begin(), b.end());
    auto w = block(q, me, count);
    a2a_want.insert(a2a_want.end(), w.begin(), w.end());
  }
  std::vector<uint8_t> a2a_out(a2a_in.size(), 0xCD);
  comm.all_to_all(a2a_in.data(), a2a_out.data(), count, dt);
  check_equal(a2a_out, a2a_want, count * size_t(W), dt, label("all_to_all", dt, count));
  comm.all_to_all(a2a_in.data(), a2a_in.data(), count, dt);
  check_equal(a2a_in, a2a_want, count * size_t(W), dt, label("all_to_all in place", dt, count));

  // all_to_all_v: p sends (count + p + 2q) % (count + 1) elements to q; then the same with the last
  // rank moving nothing at all (it must still take part: the others' engine may exchange empty
  // messages with it)
  auto n_pq = [&](int p, int q) { return count == 0 ? size_t(0) : (count + size_t(p) + 2 * size_t(q)) % (count + 1); };
  auto idle_last = [&](int p, int q) { return p == W - 1 || q == W - 1 ? size_t(0) : n_pq(p, q) + 1; };
  for (const auto& n : {std::function<size_t(int, int)>(n_pq), std::function<size_t(int, int)>(idle_last)}) {
    std::vector<size_t> sends, recvs;
    std::vector<uint8_t> v_in, v_want;
    for (int q = 0; q < W; ++q) {
      sends.push_back(n(me, q));
      recvs.push_back(n(q, me));
      auto b = block(me, q, n(me, q));
      v_in.insert(v_in.end(), b.begin(), b.end());
      auto w = block(q, me, n(q, me));
      v_want.insert(v_want.end(), w.begin(), w.end());
    }
    std::vector<uint8_t> v_out(v_want.size() + 1, 0xCD);
    comm.all_to_all_v(v_in.data(), sends, v_out.data(), recvs, dt);
    check_equal(v_out, v_want, v_want.size() / es, dt, label("all_to_all_v", dt, count));
  }
}

inline void sweep(Communicator& comm, const SweepConfig& config) {
  uint64_t salt = 1;
  for (size_t count : config.counts) {
    const bool large = count > 100000;  // SweepConfig::large_types
    for (DataType dt : kAllDataTypes) {
      const auto& types = config.large_types;
      if (large && !types.empty() && std::find(types.begin(), types.end(), dt) == types.end()) continue;
      // The W-block collectives keep their whole buffers near the requested size.
      const size_t per_rank = large ? count / size_t(comm.size()) + 1 : count;
      reductions(comm, dt, count, salt++);
      movements(comm, dt, per_rank, salt++);
      comm.barrier();
    }
  }
}

}  // namespace chorus::test
