// Note [The call lock]: one collective at a time reaches a communicator's backend (Note [Call
// order]), so every collective takes and releases a lock. A std::mutex releases with a locked
// instruction, which on x86 waits until every store before it is visible to the other cores: the
// stores a small call just made into the lines its peers are polling (its call line's payload and
// phase, Note [One line per call]), each a line the peer must first give back. So the rank that
// leaves such a call first, a broadcast's root (Note [Owed waits]), waited for its message to
// reach its peers before it returned, and Open MPI's root, which writes its peer's mailbox with
// plain stores and returns, did not. This lock is released with a plain store, as a post is
// (shm::post: the same Dekker pair with a sleeper, Note [Light posts]); it is taken with an
// atomic compare-and-swap, as a mutex is, before the call has stored anything. A thread that finds it
// held sleeps on it, counted in waiters_, and is woken by the release. W=2 on a 2-core Zen 4 VM
// whose two vCPUs at times share no cache (the barrier 0.32 us instead of 0.11), the 8-byte
// broadcast's root: with a std::mutex 0.07 us in 47 rounds of 60 and 0.11 in 13 (bench/states.py),
// with this lock 0.07 in all of 150 rounds, 14 of them in the slow state (Open MPI: 0.07 in its
// fast state, 0.12 in its slow); in alternating rounds that met the slow state, 0.12 against 0.06.
// A later run of 100 rounds: 0.06 in 92 and 0.17 in 8, Open MPI 0.07 in 73 and 0.18 in 27.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm/waiter.h"

namespace chorus {

class CallLock {
 public:
  CallLock() : light_(shm::asymmetric_fences()) {}
  // BasicLockable, for std::lock_guard. Not recursive. lock() blocks until the lock is free.
  void lock() {
    uint32_t free = 0;
    if (held_.compare_exchange_strong(free, 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
    lock_contended();
  }
  void unlock() { shm::post(held_, waiters_, 0, light_); }

 private:
  void lock_contended();

  std::atomic<uint32_t> held_{0};     // 1 while a thread holds the lock; the futex word
  std::atomic<uint32_t> waiters_{0};  // threads sleeping on held_
  const bool light_;                  // releases pair with sleeper_fence() (Note [Light posts])
};

}  // namespace chorus
