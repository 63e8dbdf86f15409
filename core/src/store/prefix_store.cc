#include "chorus/core/prefix_store.h"

namespace chorus {

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) {
  base_->wait(k(keys), timeout.value_or(this->timeout()));
}

}  // namespace chorus
