#include "net/algorithms.h"

#include <algorithm>

namespace chorus::net {
namespace {

Span in(size_t offset, size_t bytes) { return {Buf::In, offset, bytes}; }
Span out(size_t offset, size_t bytes) { return {Buf::Out, offset, bytes}; }
Span tmp(size_t offset, size_t bytes) { return {Buf::Tmp, offset, bytes}; }
Move send(int peer, Span s) { return {peer, true, s, false, {}}; }
Move recv(int peer, Span s) { return {peer, false, s, false, {}}; }
// into = from op what arrives: the first fold of a span whose data still lies in `from`.
Move recv_fold_from(int peer, Span land, Span into, Span from) { return {peer, false, land, true, into, from}; }
Move recv_fold(int peer, Span land, Span into) { return recv_fold_from(peer, land, into, into); }

// The first element of block i of P over count elements (blocks differ by one at most).
size_t edge(size_t count, int p, int i) { return count * size_t(i) / size_t(p); }

// Recursive doubling and halving-doubling run on a power of two of ranks: the first 2 * extra
// ranks pair up, the even one of each pair hands its data to the odd one and sits out, and gets
// the result back at the end. `v` is the rank among the p2 that take part (-1: sits out).
struct PowerOfTwo {
  int p2 = 1, extra = 0, v = -1;
  PowerOfTwo(int rank, int p) {
    while (p2 * 2 <= p) p2 *= 2;
    extra = p - p2;
    v = rank < 2 * extra ? (rank % 2 ? rank / 2 : -1) : rank - extra;
  }
  int real(int virt) const { return virt < extra ? 2 * virt + 1 : virt + extra; }
};

// all_reduce starts with this rank's data in In and nothing in Out; each span's first fold reads
// In, and afterwards the span is Out's. `whole` says whether all of Out has been written.
void fold_in_extras(Links& l, const PowerOfTwo& q, size_t bytes, bool* whole) {
  const int r = l.rank();
  if (r >= 2 * q.extra) return;
  if (q.v < 0)
    l.exchange({send(r + 1, in(0, bytes))});
  else
    l.exchange({recv_fold_from(r - 1, tmp(0, bytes), out(0, bytes), in(0, bytes))}), *whole = true;
}

void hand_back_to_extras(Links& l, const PowerOfTwo& q, size_t bytes) {
  const int r = l.rank();
  if (r >= 2 * q.extra) return;
  l.exchange({q.v < 0 ? recv(r + 1, out(0, bytes)) : send(r - 1, out(0, bytes))});
}

void all_reduce_doubling(Links& l, size_t bytes) {
  const PowerOfTwo q(l.rank(), l.size());
  l.reserve_tmp(bytes);
  bool whole = false;
  fold_in_extras(l, q, bytes, &whole);
  if (q.v >= 0)
    for (int mask = 1; mask < q.p2; mask <<= 1) {
      // The data is being sent: what arrives is folded in only after the exchange.
      const Span mine = whole ? out(0, bytes) : in(0, bytes);
      l.exchange({send(q.real(q.v ^ mask), mine), recv(q.real(q.v ^ mask), tmp(0, bytes))});
      l.fold(out(0, bytes), mine, tmp(0, bytes));
      whole = true;
    }
  hand_back_to_extras(l, q, bytes);
}

void all_reduce_halving(Links& l, size_t count, size_t elem) {
  const PowerOfTwo q(l.rank(), l.size());
  const size_t bytes = count * elem;
  l.reserve_tmp(bytes);
  bool whole = false;
  fold_in_extras(l, q, bytes, &whole);
  if (q.v >= 0) {
    // Halving: at each level keep one half of the range and send the other to the partner, who
    // keeps that one. The ranges are remembered for the doubling that retraces them.
    std::vector<std::pair<size_t, size_t>> levels;  // the range before each split, elements
    size_t lo = 0, hi = count;
    // Nearest partner first, as recursive doubling pairs them: the two sum in the same tree and
    // give the same bits.
    for (int mask = 1; mask < q.p2; mask *= 2) {
      levels.emplace_back(lo, hi);
      const size_t mid = lo + (hi - lo) / 2;
      const bool lower = (q.v & mask) == 0;
      const size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
      // The first level reads In (unless the extras' data was folded into Out); the rest lie in
      // the half that level kept, in Out.
      const Buf src = whole || mask > 1 ? Buf::Out : Buf::In;
      const Span keep = out(keep_lo * elem, (keep_hi - keep_lo) * elem);
      l.exchange({send(q.real(q.v ^ mask), {src, give_lo * elem, (give_hi - give_lo) * elem}),
                  recv_fold_from(q.real(q.v ^ mask), tmp(0, keep.bytes), keep, {src, keep.offset, keep.bytes})});
      lo = keep_lo, hi = keep_hi;
    }
    for (int mask = q.p2 / 2; mask >= 1; mask /= 2) {  // doubling: swap halves back, level by level
      const auto [whole_lo, whole_hi] = levels.back();
      levels.pop_back();
      const size_t other_lo = lo == whole_lo ? hi : whole_lo, other_hi = lo == whole_lo ? whole_hi : lo;
      l.exchange({send(q.real(q.v ^ mask), out(lo * elem, (hi - lo) * elem)),
                  recv(q.real(q.v ^ mask), out(other_lo * elem, (other_hi - other_lo) * elem))});
      lo = whole_lo, hi = whole_hi;
    }
  }
  hand_back_to_extras(l, q, bytes);
}

void all_reduce_ring(Links& l, size_t count, size_t elem) {
  const int p = l.size(), r = l.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  auto chunk = [&](int i, Buf b = Buf::Out) {
    return Span{b, edge(count, p, i) * elem, (edge(count, p, i + 1) - edge(count, p, i)) * elem};
  };
  l.reserve_tmp((count / size_t(p) + 1) * elem);
  // reduce-scatter: chunk (r + 1) % p ends complete here. Each chunk is folded once, from In; the
  // one sent at step s > 0 is the one folded at step s - 1.
  for (int s = 0; s < p - 1; ++s) {
    const int m = (r - s + p) % p, t = (r - s - 1 + p) % p;
    l.exchange({send(next, chunk(m, s == 0 ? Buf::In : Buf::Out)),
                recv_fold_from(prev, tmp(0, chunk(t).bytes), chunk(t), chunk(t, Buf::In))});
  }
  for (int s = 0; s < p - 1; ++s)  // all-gather of the complete chunks
    l.exchange({send(next, chunk((r + 1 - s + p) % p)), recv(prev, chunk((r - s + p) % p))});
}

void reduce_scatter_ring(Links& l, size_t count, size_t elem) {
  const int p = l.size(), r = l.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  const size_t b = count * elem;
  if (p == 1) return l.copy(in(0, b), out(0, b));
  // The partial sum of a block travels around the ring, each rank adding its own block; two
  // scratch blocks take turns holding the partial sent and the one arriving.
  l.reserve_tmp(2 * b);
  int cur = 0;
  for (int s = 0; s < p - 1; ++s) {
    const int sent = (r - s - 1 + 2 * p) % p, arriving = (r - s - 2 + 2 * p) % p;
    const Span outgoing = s == 0 ? in(size_t(sent) * b, b) : tmp(size_t(cur) * b, b);
    const Span landing = tmp(size_t(1 - cur) * b, b);
    l.exchange({send(next, outgoing), recv(prev, landing)});
    // The last partial is this rank's block: it is summed straight into Out.
    l.fold(s == p - 2 ? out(0, b) : landing, landing, in(size_t(arriving) * b, b));
    cur = 1 - cur;
  }
}

void reduce_scatter_direct(Links& l, size_t count, size_t elem) {
  const int p = l.size(), r = l.rank();
  const size_t b = count * elem;
  if (p == 1) return l.copy(in(0, b), out(0, b));
  l.reserve_tmp(size_t(p - 1) * b);
  std::vector<Move> moves;
  for (int q = 0, slot = 0; q < p; ++q)
    if (q != r) {
      moves.push_back(send(q, in(size_t(q) * b, b)));
      moves.push_back(recv(q, tmp(size_t(slot++) * b, b)));
    }
  l.exchange(moves);
  // In the ring's order (rank r + 1 first, this rank's own block last), so that direct and ring
  // give the same bits.
  auto block_of = [&](int q) { return q == r ? in(size_t(r) * b, b) : tmp(size_t(q < r ? q : q - 1) * b, b); };
  l.fold(out(0, b), block_of((r + 1) % p), block_of((r + 2) % p));
  for (int q = (r + 3) % p; q != (r + 1) % p; q = (q + 1) % p) l.fold(out(0, b), block_of(q));
}

void all_gather_ring(Links& l, size_t b) {
  const int p = l.size(), r = l.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  l.copy(in(0, b), out(size_t(r) * b, b));
  for (int s = 0; s < p - 1; ++s)
    l.exchange({send(next, out(size_t((r - s + p) % p) * b, b)), recv(prev, out(size_t((r - s - 1 + p) % p) * b, b))});
}

void all_gather_direct(Links& l, size_t b) {
  const int p = l.size(), r = l.rank();
  l.copy(in(0, b), out(size_t(r) * b, b));
  std::vector<Move> moves;
  for (int q = 0; q < p; ++q)
    if (q != r) {
      moves.push_back(send(q, out(size_t(r) * b, b)));
      moves.push_back(recv(q, out(size_t(q) * b, b)));
    }
  l.exchange(moves);
}

void broadcast_binomial(Links& l, size_t bytes, int root) {
  const int p = l.size(), v = (l.rank() - root + p) % p;
  int mask = 1;
  for (; mask < p; mask <<= 1)
    if (v & mask) {
      l.exchange({recv((v - mask + root) % p, out(0, bytes))});
      break;
    }
  std::vector<Move> children;  // all at once: the data is whole here
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) children.push_back(send((v + mask + root) % p, out(0, bytes)));
  if (!children.empty()) l.exchange(children);
}

void broadcast_scatter_ring(Links& l, size_t bytes, int root) {
  const int p = l.size(), r = l.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  auto block = [&](int i) { return out(edge(bytes, p, i), edge(bytes, p, i + 1) - edge(bytes, p, i)); };
  std::vector<Move> scatter;
  if (r == root) {
    for (int q = 0; q < p; ++q)
      if (q != root) scatter.push_back(send(q, block(q)));
  } else {
    scatter.push_back(recv(root, block(r)));
  }
  l.exchange(scatter);
  l.reserve_tmp(bytes / size_t(p) + 1);
  for (int s = 0; s < p - 1; ++s) {  // the root has every block: what reaches it is dropped
    const Span arriving = block((r - s - 1 + p) % p);
    l.exchange({send(next, block((r - s + p) % p)), recv(prev, r == root ? tmp(0, arriving.bytes) : arriving)});
  }
}

// Each rank passes segment k on while segment k+1 arrives: P - 2 + S steps of one segment.
void broadcast_chain(Links& l, size_t bytes, int root, size_t segments) {
  const int p = l.size(), v = (l.rank() - root + p) % p;
  const int next = v + 1 < p ? (l.rank() + 1) % p : -1, prev = v > 0 ? (l.rank() + p - 1) % p : -1;
  const size_t s = std::clamp<size_t>(segments, 1, std::max<size_t>(bytes, 1));
  auto piece = [&](size_t k) {
    return out(edge(bytes, int(s), int(k)), edge(bytes, int(s), int(k) + 1) - edge(bytes, int(s), int(k)));
  };
  // Step t: segment t arrives from prev (if any left), segment t - 1 goes to next.
  for (size_t t = 0; t < s + 1; ++t) {
    std::vector<Move> moves;
    if (prev >= 0 && t < s) moves.push_back(recv(prev, piece(t)));
    if (next >= 0 && t >= (prev >= 0 ? 1 : 0) && t - (prev >= 0 ? 1 : 0) < s)
      moves.push_back(send(next, piece(t - (prev >= 0 ? 1 : 0))));
    if (!moves.empty()) l.exchange(moves);
  }
}

}  // namespace

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::RecursiveDoubling: return "recursive_doubling";
    case Algorithm::Ring: return "ring";
    case Algorithm::HalvingDoubling: return "halving_doubling";
    case Algorithm::Direct: return "direct";
    case Algorithm::Binomial: return "binomial";
    case Algorithm::ScatterRing: return "scatter_ring";
    case Algorithm::Chain: return "chain";
  }
  return "?";
}

bool parse_algorithm(const std::string& name, Algorithm* out) {
  for (auto a : {Algorithm::RecursiveDoubling, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Direct,
                 Algorithm::Binomial, Algorithm::ScatterRing, Algorithm::Chain})
    if (name == algorithm_name(a)) return *out = a, true;
  return false;
}

void all_reduce(Links& l, size_t count, size_t elem, Algorithm a) {
  if (l.size() == 1) return l.copy(in(0, count * elem), out(0, count * elem));
  if (a == Algorithm::Ring) return all_reduce_ring(l, count, elem);
  if (a == Algorithm::HalvingDoubling && count >= size_t(l.size())) return all_reduce_halving(l, count, elem);
  all_reduce_doubling(l, count * elem);
}

void reduce_scatter(Links& l, size_t count, size_t elem, Algorithm a) {
  if (a == Algorithm::Direct) return reduce_scatter_direct(l, count, elem);
  reduce_scatter_ring(l, count, elem);
}

void all_gather(Links& l, size_t bytes, Algorithm a) {
  if (a == Algorithm::Direct) return all_gather_direct(l, bytes);
  all_gather_ring(l, bytes);
}

void broadcast(Links& l, size_t bytes, int root, Algorithm a, size_t segments) {
  if (l.size() == 1) return;
  if (a == Algorithm::Chain) return broadcast_chain(l, bytes, root, segments);
  if (a == Algorithm::ScatterRing && bytes >= size_t(l.size())) return broadcast_scatter_ring(l, bytes, root);
  broadcast_binomial(l, bytes, root);
}

void reduce(Links& l, size_t count, size_t elem, int root) {
  const int p = l.size(), r = l.rank(), v = (r - root + p) % p;
  const size_t bytes = count * elem;
  // The root adds into Out; the others into Tmp's first half, receiving into its second.
  const Span acc = r == root ? out(0, bytes) : tmp(0, bytes);
  const Span landing = r == root ? tmp(0, bytes) : tmp(bytes, bytes);
  l.reserve_tmp(2 * bytes);
  l.copy(in(0, bytes), acc);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (v & mask) {
      l.exchange({send((v - mask + root) % p, acc)});
      return;
    }
    if (v + mask < p) l.exchange({recv_fold((v + mask + root) % p, landing, acc)});
  }
}

void barrier(Links& l) {
  const int p = l.size(), r = l.rank();
  for (int d = 1; d < p; d <<= 1) l.exchange({send((r + d) % p, out(0, 0)), recv((r - d + p) % p, out(0, 0))});
}

}  // namespace chorus::net
