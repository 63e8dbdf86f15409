// An in-process Store: threads of one process rendezvous through it (tests, single-process use).
#pragma once

#include <condition_variable>
#include <mutex>

#include "chorus/core/store.h"

namespace chorus {

// Thread-safe. Blocking calls wait on a condition variable up to their timeout.
class HashStore : public Store {
 public:
  using Store::Store;
  CHORUS_STORE_OPERATIONS;
  std::string describe() const override { return "HashStore"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  KeyValueTable table_;
};

}  // namespace chorus
