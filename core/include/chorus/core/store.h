// The small key-value store every rendezvous goes through (modeled on c10d's Store).
// Values are byte strings (binary-safe std::string). Implementations: HashStore (in-process),
// PrefixStore (namespacing), TcpStore (across processes and hosts).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace chorus {

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout = std::chrono::minutes(5)) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets key to value, waking anyone waiting for it. Does not block on other clients.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The key's value; blocks up to timeout() for it to appear, then throws StoreError naming it.
  virtual std::string get(const std::string& key) = 0;
  // Adds delta to the integer stored at key (absent counts as 0) and returns the new value.
  // Throws StoreError when the stored value is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its value equals expected (or it is absent and expected is empty).
  // Returns the value stored afterwards (empty when absent).
  virtual std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) = 0;
  // Blocks until every key exists; throws StoreError naming the missing keys after the timeout
  // (timeout() when not given).
  virtual void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, std::nullopt); }
  // True when every key exists. Does not block.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes key; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Where this store lives, for error messages ("TcpStore 127.0.0.1:29500").
  virtual std::string describe() const = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  // Not synchronized: set before sharing the store between threads.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

// The data model shared by HashStore and the TcpStore server: a map plus the operations'
// semantics. Not synchronized; callers hold their own lock.
class KeyValueTable {
 public:
  void set(const std::string& key, std::string value);
  const std::string* find(const std::string& key) const;
  int64_t add(const std::string& key, int64_t delta);  // throws StoreError on a non-integer value
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool contains_all(const std::vector<std::string>& keys) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  bool erase(const std::string& key);

 private:
  std::unordered_map<std::string, std::string> map_;
};

// In the class body of a Store implementation: declares its overrides of the seven key-value
// operations (and keeps the base's wait(keys) overload visible). describe() is declared apart.
#define CHORUS_STORE_OPERATIONS                                                                                      \
  using Store::wait;                                                                                                 \
  void set(const std::string& key, const std::string& value) override;                                               \
  std::string get(const std::string& key) override;                                                                  \
  int64_t add(const std::string& key, int64_t delta) override;                                                       \
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override; \
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) override;        \
  bool check(const std::vector<std::string>& keys) override;                                                         \
  bool delete_key(const std::string& key) override

}  // namespace chorus
