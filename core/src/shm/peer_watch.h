// Failure detection on shared memory: every peer is a process on this host, so a peer's death is
// seen through its pid (the counterpart of the engines' engine/peer_watch.h, which watches peers
// through the store). ShmGroup::check_peers turns what it sees into errors.
#pragma once

#include <vector>

namespace chorus::shm {

// Tells whether peer processes are still alive: pidfds where the kernel has them (they see a
// killed child even before its parent reaps it), else kill(pid, 0) plus /proc's zombie state.
class PeerWatch {
 public:
  PeerWatch() = default;
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;
  void watch(int rank, int pid);  // pid <= 0: unknown, always "alive"
  bool alive(int rank) const;

 private:
  std::vector<int> pids_, fds_;
};

}  // namespace chorus::shm
