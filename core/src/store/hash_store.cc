#include "chorus/core/hash_store.h"

#include "chorus/core/error.h"
#include "store/store_util.h"

namespace chorus {

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    table_.set(key, value);
  }
  cv_.notify_all();
}

std::string HashStore::get(const std::string& key) {
  wait({key}, std::nullopt);
  std::lock_guard<std::mutex> lock(mu_);
  return *table_.find(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = table_.add(key, delta);
  }
  cv_.notify_all();
  return v;
}

std::string HashStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::string v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = table_.compare_set(key, expected, desired);
  }
  cv_.notify_all();
  return v;
}

void HashStore::wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) {
  const auto limit = timeout.value_or(this->timeout());
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, limit, [&] { return table_.contains_all(keys); }))
    throw StoreError(missing_keys_message(describe(), table_.missing(keys), limit));
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.contains_all(keys);
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.erase(key);
}

}  // namespace chorus
