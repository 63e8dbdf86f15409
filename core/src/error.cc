#include "chorus/core/error.h"

namespace chorus::detail {

void enforce_failed(const char* file, int line, const char* cond, const std::string& detail) {
  std::string msg = concat("chorus internal check failed: ", cond, " at ", file, ":", line);
  if (!detail.empty()) msg += concat(" (", detail, ")");
  throw Error(msg);
}

}  // namespace chorus::detail
