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
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string describe() const override { return "HashStore"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  KeyValueTable table_;
};

}  // namespace chorus
