#include "communicator/call_lock.h"

#include <chrono>

namespace chorus {

void CallLock::lock_contended() {
  // Note [Light posts]: counted in first, then a barrier on every CPU, then the look at held_:
  // a release this thread does not see afterwards reads waiters_ after the barrier, and wakes it.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (light_) shm::sleeper_fence();
  for (;;) {
    uint32_t free = 0;
    if (held_.compare_exchange_strong(free, 1, std::memory_order_acquire, std::memory_order_relaxed)) break;
    shm::futex_wait(&held_, 1, std::chrono::milliseconds(20));  // returns at once if held_ is no longer 1
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace chorus
