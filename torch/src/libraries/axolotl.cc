// Axolotl-style helpers: the leader-runs patterns on the default group.
#include "chorus/axolotl.h"

#include "parallel/objects/collective.h"

namespace chorus {

using detail::concat;

inline namespace axolotl {

bool is_distributed() { return is_initialized() && default_group()->size() > 1; }

bool is_main_process() { return !is_distributed() || default_group()->rank() == 0; }

void barrier() {
  if (is_distributed()) default_group()->barrier();
}

void zero_first(bool is_main, const std::function<void()>& fn) {
  if (!is_distributed()) return fn();
  detail::leaders_first(*default_group(), is_main, fn, "zero_first");
}

void zero_only(const std::function<void()>& fn) {
  if (is_main_process()) fn();
}

}  // namespace axolotl

namespace detail {

static void check_single(int rank, const char* what) {
  if (rank != 0) throw InvalidArgument(concat(what, ": rank ", rank, " does not exist: this is a single process"));
}

c10::IValue compute_and_broadcast_value(const std::function<c10::IValue()>& fn, int rank, const char* what) {
  if (!is_distributed()) {
    check_single(rank, what);
    return fn();
  }
  return broadcast_value(*default_group(), rank, fn, what);
}

std::optional<std::vector<c10::IValue>> gather_values_to(const std::function<c10::IValue()>& fn, int rank,
                                                         const char* what) {
  if (!is_distributed()) {
    check_single(rank, what);
    return std::vector<c10::IValue>{fn()};
  }
  auto g = default_group();
  if (rank < 0) g->communicator().reject(what, concat("rank ", rank, " is not a rank of this group"));
  return gather_values(*g, rank, fn, what);
}

}  // namespace detail
}  // namespace chorus
