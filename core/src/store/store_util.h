#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "chorus/core/error.h"

namespace chorus {

inline std::string missing_keys_message(const std::string& store, const std::vector<std::string>& missing,
                                        std::chrono::milliseconds waited) {
  std::string keys;
  for (const auto& k : missing) keys += (keys.empty() ? "'" : ", '") + k + "'";
  return detail::concat(store, ": keys ", keys, " did not appear within ", waited.count(), " ms");
}

}  // namespace chorus
