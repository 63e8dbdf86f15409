// Namespaces another store: every key gets "<prefix>/" in front. One per process group.
#pragma once

#include <memory>

#include "chorus/core/store.h"

namespace chorus {

// Thread-safe when the underlying store is.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : Store(base->timeout()), prefix_(std::move(prefix)), base_(std::move(base)) {}
  using Store::wait;
  void set(const std::string& key, const std::string& value) override { base_->set(k(key), value); }
  std::string get(const std::string& key) override { return base_->get(k(key)); }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(k(key), delta); }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    return base_->compare_set(k(key), expected, desired);
  }
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) override;
  bool check(const std::vector<std::string>& keys) override { return base_->check(k(keys)); }
  bool delete_key(const std::string& key) override { return base_->delete_key(k(key)); }
  std::string describe() const override { return base_->describe() + " prefix '" + prefix_ + "'"; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace chorus
