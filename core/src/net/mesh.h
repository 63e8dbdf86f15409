// Note [chorus's own TCP]: the "tcp" engine's sockets. Gloo's TCP transport hands every message
// to a device thread and sends its payload only after the receiver has announced a matching
// buffer, so each hop costs a round trip and two thread wake-ups; a 4-rank all_reduce of 8 bytes
// (six hops of its ring) took 0.5 ms over veth. Here a message goes out at once and the caller's
// own thread reads it: a framed write on one side, a poll() and a read on the other.
//
// The mesh connects every pair of ranks three times, one socket per channel (collectives, point
// to point data, point to point replies), so that the channels never interleave. Each message is
// a 16-byte header (magic, length) and its payload; a receiver that expected another length fails
// the call instead of reading past its buffer. Every socket is non-blocking, and one call's
// transfers all progress together in one poll() loop, with the mesh's interrupt descriptor in
// every poll: interrupt() (the watchdog, from another thread) fails the call in progress and every
// later one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/core/store.h"

namespace chorus::net {

enum class Channel : uint8_t { Collective = 0, Data = 1, Reply = 2 };
constexpr int kChannels = 3;

// One message to send or receive, progressed by Mesh::run. A receive may fold what arrives into
// `fold_into` as it arrives (fold(fold_into, fold_from, data, n elements of `elem` bytes), where
// fold_from is fold_into unless set), so the reduction overlaps the network.
struct Transfer {
  int peer = -1;
  bool send = false;
  uint8_t* data = nullptr;
  size_t bytes = 0;
  Channel channel = Channel::Collective;
  std::function<void(void* out, const void* a, const void* b, size_t n)> const* fold = nullptr;
  uint8_t *fold_into = nullptr, *fold_from = nullptr;
  size_t elem = 1;
  // progress, kept by Mesh::run
  uint64_t header[2] = {0, 0};
  size_t header_done = 0, done = 0, folded = 0;
};

class Mesh {
 public:
  // Collective over the group of `store`: listens on the address that routes toward MASTER_ADDR
  // (or on CHORUS_SOCKET_IFNAME's, else GLOO_SOCKET_IFNAME's interface), publishes it with a
  // token, and connects to every other rank before `deadline`. Throws EngineFailure naming a rank
  // that could not be reached.
  Mesh(Store& store, int rank, int size, std::chrono::steady_clock::time_point deadline);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The address other ranks reach this one at ("10.0.0.2:41234"), and the IP of rank r's.
  const std::string& address() const { return address_; }
  const std::string& host_of(int r) const { return hosts_[size_t(r)]; }

  // Runs the transfers together until all are done. Throws EngineFailure on a closed or broken
  // connection (naming the peer), a header of the wrong length, the deadline, or an interrupt.
  // Never two transfers on one peer, channel and direction.
  void run(std::vector<Transfer>& transfers, std::chrono::steady_clock::time_point deadline);
  // Waits for the first message on `channel` from any of `peers` and receives it into `t` (peer
  // set to the sender). Same failures as run.
  void run_any(Transfer& t, const std::vector<int>& peers, std::chrono::steady_clock::time_point deadline);
  // From another thread: the call in progress and every later one throw EngineFailure.
  void interrupt();

 private:
  void connect(Store& store, std::chrono::steady_clock::time_point deadline);  // the constructor's work
  void close_all();
  int fd(int peer, Channel c) const { return fds_[size_t(peer) * kChannels + size_t(c)]; }
  // One step of t on its socket: false when it would block. Throws on failure.
  bool advance(Transfer& t);
  void check_interrupt(bool readable) const;
  // Sets t's socket's SO_RCVLOWAT (Note [Waking for bytes]).
  void wake_after(const Transfer& t, int bytes);
  [[noreturn]] void broken(const Transfer& t, const std::string& why) const;

  const int rank_, size_;
  std::vector<int> fds_;    // [peer][channel], -1 for this rank
  std::vector<int> lowat_;  // each socket's SO_RCVLOWAT (Note [Waking for bytes])
  int wake_ = -1;           // eventfd, readable once interrupted
  std::string address_;
  std::vector<std::string> hosts_;
};

}  // namespace chorus::net
