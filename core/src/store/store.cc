#include <charconv>

#include "chorus/core/error.h"
#include "chorus/core/store.h"

namespace chorus {

void KeyValueTable::set(const std::string& key, std::string value) { map_[key] = std::move(value); }

const std::string* KeyValueTable::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

int64_t KeyValueTable::add(const std::string& key, int64_t delta) {
  int64_t current = 0;
  if (const std::string* v = find(key)) {
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), current);
    if (ec != std::errc() || end != v->data() + v->size())
      throw StoreError(detail::concat("store add('", key, "'): the stored value is not an integer"));
  }
  current += delta;
  map_[key] = std::to_string(current);
  return current;
}

std::string KeyValueTable::compare_set(const std::string& key, const std::string& expected,
                                       const std::string& desired) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (!expected.empty()) return {};
    map_[key] = desired;
    return desired;
  }
  if (it->second == expected) it->second = desired;
  return it->second;
}

bool KeyValueTable::contains_all(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!map_.count(k)) return false;
  return true;
}

std::vector<std::string> KeyValueTable::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!map_.count(k)) out.push_back(k);
  return out;
}

bool KeyValueTable::erase(const std::string& key) { return map_.erase(key) > 0; }

}  // namespace chorus
