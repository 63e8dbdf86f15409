#include "communicator/arguments.h"

#include <optional>
#include <set>

#include "chorus/core/error.h"

namespace chorus {
namespace {

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

uint64_t sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

// Keeps the first problem found with a call's arguments, in words that say what to do.
class Validation {
 public:
  Validation(Call& c, int rank, int size, const std::string& group) : c_(c), rank_(rank), size_(size), group_(group) {}
  bool ok() const { return c_.invalid.empty(); }
  void fail(const std::string& why) {
    if (ok()) c_.invalid = detail::concat(describe(c_), " on group '", group_, "' (rank ", rank_, "): ", why);
  }
  void dtype() {
    if (uint8_t(c_.dtype) > uint8_t(DataType::Bool)) fail(detail::concat("unknown dtype code ", int(c_.dtype)));
  }
  void op() {
    if (uint8_t(c_.op) > uint8_t(ReduceOp::BitwiseXor)) return fail("unknown reduce op");
    if (auto why = reduce_op_problem(c_.dtype, c_.op); !why.empty()) fail(why);
  }
  void rank(int r, const char* role) {
    if (r < 0 || r >= size_) fail(detail::concat(role, " ", r, " is not a rank of this group (size ", size_, ")"));
  }
  void buffer(const void* p, uint64_t elems, const char* name) {
    if (!p && elems) fail(detail::concat(name, " is null but must hold ", elems, " elements"));
  }
  // Buffer a may start exactly `a_at` elements into buffer b (the in-place form; none when
  // nullopt), or be disjoint from it. Skipped once an earlier check failed: the dtype may be
  // unknown, and the call must still reach the others.
  void aliasing(const void* a, uint64_t a_elems, const void* b, uint64_t b_elems, std::optional<uint64_t> a_at) {
    if (!ok()) return;
    const size_t es = element_size(c_.dtype);
    if (a_at && a == static_cast<const uint8_t*>(b) + *a_at * es) return;
    if (overlaps(a, a_elems * es, b, b_elems * es))
      fail("input and output overlap: pass disjoint buffers, or use the documented in-place form");
  }
  void counts(const std::vector<uint64_t>& v, const char* name) {
    if (v.size() != size_t(size_))
      fail(detail::concat(name, " has ", v.size(), " entries but the group has ", size_, " ranks"));
  }
  // The in and out buffers of a call whose input holds `in_elems` and output `out_elems`
  // elements on this rank; `out_at`: where the output may sit in the input (in place), as
  // elements into it; `in_at`: where the input may sit in the output.
  void buffers(uint64_t in_elems, uint64_t out_elems, bool has_out, std::optional<uint64_t> in_at,
               std::optional<uint64_t> out_at) {
    buffer(c_.in, in_elems, "input");
    if (!has_out) return;
    buffer(c_.out, out_elems, "output");
    if (out_at)
      aliasing(c_.out, out_elems, c_.in, in_elems, out_at);
    else
      aliasing(c_.in, in_elems, c_.out, out_elems, in_at);
  }

 private:
  Call& c_;
  int rank_, size_;
  const std::string& group_;
};

}  // namespace

void validate_arguments(Call& c, int rank, int size, const std::string& group) {
  Validation v(c, rank, size, group);
  const uint64_t n = c.count, W = uint64_t(size);
  const bool root = rank == c.root;
  switch (c.kind) {
    case OpKind::Barrier:
    case OpKind::AllocSymmetric: return;
    case OpKind::AllReduce:
      v.dtype();
      v.op();
      return v.buffers(n, n, true, 0, std::nullopt);
    case OpKind::Reduce:
      v.dtype();
      v.op();
      v.rank(c.root, "root");
      return v.buffers(n, n, root, 0, std::nullopt);  // the output matters on the root only
    case OpKind::Broadcast:
      v.dtype();
      v.rank(c.root, "root");
      return v.buffer(c.out, n, "buffer");
    case OpKind::ReduceScatter:
      v.dtype();
      v.op();
      return v.buffers(n * W, n, true, std::nullopt, n * uint64_t(rank));
    case OpKind::Scatter:
      v.dtype();
      v.rank(c.root, "root");
      v.buffer(c.out, n, "output");
      if (root) {
        v.buffer(c.in, n * W, "input");
        v.aliasing(c.out, n, c.in, n * W, n * uint64_t(rank));
      }
      return;
    case OpKind::AllToAll: v.dtype(); return v.buffers(n * W, n * W, true, 0, std::nullopt);
    case OpKind::AllGather:
    case OpKind::Gather:
    case OpKind::AllGatherV:
    case OpKind::GatherV: {
      const bool uneven = c.kind == OpKind::AllGatherV || c.kind == OpKind::GatherV;
      const bool to_all = c.kind == OpKind::AllGather || c.kind == OpKind::AllGatherV;
      v.dtype();
      if (!to_all) v.rank(c.root, "root");
      if (uneven) v.counts(c.counts, "counts");
      if (!v.ok()) break;
      if (!c.outs.empty()) {  // all_gather_to: one buffer per rank
        if (c.outs.size() != size_t(size))
          return v.fail(detail::concat("outs has ", c.outs.size(), " buffers but the group has ", size, " ranks"));
        v.buffer(c.in, n, "input");
        const size_t es = element_size(c.dtype);
        for (int p = 0; p < size; ++p) {
          v.buffer(c.outs[size_t(p)], n, "an output");
          if (p != rank) v.aliasing(c.outs[size_t(p)], n, c.in, n, std::nullopt);
          for (int q = 0; q < p && v.ok(); ++q)
            if (overlaps(c.outs[size_t(p)], n * es, c.outs[size_t(q)], n * es))
              v.fail(detail::concat("the outputs of ranks ", q, " and ", p, " overlap"));
        }
        if (c.outs[size_t(rank)] != c.in) v.aliasing(c.outs[size_t(rank)], n, c.in, n, std::nullopt);
        return;
      }
      uint64_t mine = n, total = n * W, before = n * uint64_t(rank);
      if (uneven) {
        mine = c.counts[size_t(rank)];
        total = sum(c.counts);
        before = 0;
        for (int r = 0; r < rank; ++r) before += c.counts[size_t(r)];
      }
      return v.buffers(mine, total, to_all || root, before, std::nullopt);  // in place: our block of out
    }
    case OpKind::AllToAllV:
      v.dtype();
      v.counts(c.counts, "send_counts");
      v.counts(c.recv_counts, "recv_counts");
      if (!v.ok()) break;
      return v.buffers(sum(c.counts), sum(c.recv_counts), true, std::nullopt, std::nullopt);
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::RecvAny: {
      const bool sending = c.kind == OpKind::Send;
      v.dtype();
      if (c.kind == OpKind::RecvAny) {
        if (size < 2) v.fail("a group of one rank has no other rank to receive from");
      } else {
        v.rank(c.root, sending ? "destination" : "source");
        if (c.root == rank) v.fail(sending ? "a rank cannot send to itself" : "a rank cannot receive from itself");
      }
      if (c.tag < 0) v.fail("tags must be >= 0");
      return v.buffer(sending ? c.in : c.out, n, "buffer");
    }
    case OpKind::Split: {
      std::set<uint64_t> seen;
      for (uint64_t r : c.counts) {
        v.rank(int(r), "member");
        if (!seen.insert(r).second) v.fail(detail::concat("rank ", r, " is listed twice"));
      }
      if (c.counts.empty()) v.fail("the list of ranks is empty");
      // Every rank must pass the same list: the call comparison compares it element by element.
      // The shared counts area holds size() entries; a longer list repeats a rank and is invalid.
      if (c.counts.size() > size_t(size)) c.counts.resize(size_t(size));
      return;
    }
  }
  // Counts of the wrong length cannot travel (the shared area holds size() entries each).
  c.counts.clear();
  c.recv_counts.clear();
}

}  // namespace chorus
