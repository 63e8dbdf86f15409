// Point-to-point: each ordered pair (src, dst) owns a ring of two chunks. The sender fills the
// chunk the receiver has released and bumps its written counter; the receiver copies it out
// and bumps its consumed counter. Messages between a pair are matched in order: the first
// chunk carries the tag, dtype and count, and a receive that does not match them raises
// CollectiveMismatch on both ends instead of delivering the wrong bytes.
//
// A receive from any rank (recv_any) waits on the receiver's doorbell, the counter of the unused
// ring from the rank to itself: every sender rings it when a message's first chunk is in, so
// the receiver sleeps on one word whichever peer it hears from. It then takes the lowest rank
// with a message waiting and receives from it as recv does.
#include "chorus/core/error.h"
#include "shm/algorithms.h"

namespace chorus::shm {

namespace {

struct Ring {
  ChannelEnd* sender;
  ChannelEnd* receiver;
  uint8_t* chunks;
  size_t chunk;
  ChunkHeader* header(uint32_t i) {
    return reinterpret_cast<ChunkHeader*>(chunks + (i & 1) * (sizeof(ChunkHeader) + chunk));
  }
  uint8_t* data(uint32_t i) { return reinterpret_cast<uint8_t*>(header(i) + 1); }
};

Ring ring(ShmGroup& g, int src, int dst) {
  uint8_t* base = g.segment().channel(src, dst);
  return {reinterpret_cast<ChannelEnd*>(base), reinterpret_cast<ChannelEnd*>(base + sizeof(ChannelEnd)),
          base + 2 * sizeof(ChannelEnd), g.segment().layout().p2p_chunk};
}

// The doorbell of rank r: rung once per message that reaches r (Ring::sender of the pair r -> r).
ChannelEnd& doorbell(ShmGroup& g, int r) { return *reinterpret_cast<ChannelEnd*>(g.segment().channel(r, r)); }

std::string message(const char* what, int peer, int tag, DataType dtype, uint64_t count) {
  return detail::concat(what, "(", to_string(dtype), " x ", count, ", tag ", tag, ") ", what[0] == 's' ? "to" : "from",
                        " rank ", peer);
}

}  // namespace

void send(ShmGroup& g, const Call& c) {
  const int dst = c.root;
  Ring r = ring(g, g.rank(), dst);
  const size_t bytes = c.count * element_size(c.dtype);
  const auto* buf = static_cast<const uint8_t*>(c.in);
  const size_t chunks = std::max<size_t>(1, rounds_for(bytes, r.chunk));
  auto what = [&] { return message("send", dst, c.tag, c.dtype, c.count); };
  for (size_t k = 0; k < chunks; ++k) {
    const uint32_t i = r.sender->counter.load(std::memory_order_relaxed);
    auto has_room = [&] {
      return r.receiver->error.load() != 0 || i - r.receiver->counter.load(std::memory_order_acquire) < 2;
    };
    g.wait_for_peer(has_room, r.receiver->counter, r.receiver->waiters, dst, c, what);
    if (r.receiver->error.load() != 0)
      throw CollectiveMismatch(detail::concat(what(), " on group '", g.name(), "': rank ", dst,
                                              " expected a different message (see its error)"),
                               {});
    ChunkHeader* h = r.header(i);
    h->bytes = bytes;
    h->count = c.count;
    h->tag = c.tag;
    h->dtype = uint8_t(c.dtype);
    h->first = k == 0;
    copy_bytes(r.data(i), buf + k * r.chunk, in_round(bytes, r.chunk, k));
    post(r.sender->counter, r.sender->waiters, i + 1);
    if (k == 0) {  // ring the receiver's doorbell (senders may ring it at the same time: add, not store)
      ChannelEnd& bell = doorbell(g, dst);
      bell.counter.fetch_add(1, std::memory_order_seq_cst);
      if (bell.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&bell.counter);
    }
  }
}

void recv_any(ShmGroup& g, const Call& c) {
  ChannelEnd& bell = doorbell(g, g.rank());
  int from = -1;
  auto arrived = [&] {
    for (int p = 0; p < g.world(); ++p) {
      if (p == g.rank()) continue;
      Ring r = ring(g, p, g.rank());
      if (r.sender->counter.load(std::memory_order_acquire) != r.receiver->counter.load(std::memory_order_relaxed)) {
        from = p;
        return true;
      }
    }
    return false;
  };
  std::vector<int> peers;
  for (int p = 0; p < g.world(); ++p)
    if (p != g.rank()) peers.push_back(p);
  g.wait_for_peers(arrived, bell.counter, bell.waiters, peers, c, [&] { return describe(c); });
  Call from_peer = c;
  from_peer.kind = OpKind::Recv;
  from_peer.root = from;
  recv(g, from_peer);
  *c.source = from;
}

void recv(ShmGroup& g, const Call& c) {
  const int src = c.root;
  Ring r = ring(g, src, g.rank());
  const size_t bytes = c.count * element_size(c.dtype);
  auto* buf = static_cast<uint8_t*>(c.out);
  const size_t chunks = std::max<size_t>(1, rounds_for(bytes, r.chunk));
  auto what = [&] { return message("recv", src, c.tag, c.dtype, c.count); };
  for (size_t k = 0; k < chunks; ++k) {
    const uint32_t i = r.receiver->counter.load(std::memory_order_relaxed);
    auto arrived = [&] { return r.sender->counter.load(std::memory_order_acquire) != i; };
    g.wait_for_peer(arrived, r.sender->counter, r.sender->waiters, src, c, what);
    const ChunkHeader* h = r.header(i);
    if (k == 0 && (!h->first || h->tag != c.tag || h->dtype != uint8_t(c.dtype) || h->count != c.count)) {
      r.receiver->error.store(1);
      futex_wake_all(&r.receiver->counter);
      std::string sent = describe(OpKind::Send, DataType(h->dtype), ReduceOp::Sum, g.rank(), h->count);
      throw CollectiveMismatch(
          detail::concat(what(), " on group '", g.name(), "': rank ", src, " sent a different message: ", sent,
                         " with tag ", h->tag, " (messages between two ranks match in order)"),
          {sent, describe(c)});
    }
    copy_bytes(buf + k * r.chunk, r.data(i), in_round(bytes, r.chunk, k));
    post(r.receiver->counter, r.receiver->waiters, i + 1);
  }
}

}  // namespace chorus::shm
