// Axolotl's distributed helpers (docs/api.md, "Axolotl-style helpers"), in chorus::axolotl, an
// inline namespace (chorus::barrier and chorus::axolotl::barrier are the same function). They
// work on the default group. Values keep their exact C++ types (an int64 stays an int64, a double
// a double; see ivalue_convert.h for the types that move). With no default group (one process)
// they run fn here and communicate nothing.
#pragma once

#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "chorus/ivalue_convert.h"
#include "chorus/process_group.h"

namespace chorus {

namespace detail {
c10::IValue compute_and_broadcast_value(const std::function<c10::IValue()>& fn, int rank, const char* what);
std::optional<std::vector<c10::IValue>> gather_values_to(const std::function<c10::IValue()>& fn, int rank,
                                                         const char* what);
}  // namespace detail

inline namespace axolotl {

bool is_distributed();   // initialized, with more than one rank
bool is_main_process();  // global rank 0, or not distributed
void barrier();          // collective when distributed; nothing otherwise

// Collective: main (is_main true on the leader ranks) runs fn first; the others run it once
// every leader succeeded. A leader's failure reaches every rank as an Error with its message.
void zero_first(bool is_main, const std::function<void()>& fn);
// Not collective: fn on the main process only.
void zero_only(const std::function<void()>& fn);

// Collective: fn runs on `rank` only; every rank returns its value. If fn throws there, every
// rank raises (the others an Error carrying its message).
template <class F>
auto compute_and_broadcast(F&& fn, int rank = 0) {
  using R = std::decay_t<std::invoke_result_t<F>>;
  if constexpr (std::is_void_v<R>) {
    detail::compute_and_broadcast_value(
        [&] {
          fn();
          return c10::IValue();
        },
        rank, "compute_and_broadcast");
  } else {
    return from_ivalue<R>(
        detail::compute_and_broadcast_value([&] { return to_ivalue(fn()); }, rank, "compute_and_broadcast"));
  }
}

// Collective: fn runs on every rank; `rank` gets every value in rank order, the others nullopt.
// A failure on any rank reaches every rank.
template <class F>
auto gather_from_all_ranks(F&& fn, int rank = 0) {
  using R = std::decay_t<std::invoke_result_t<F>>;
  auto values = detail::gather_values_to([&] { return to_ivalue(fn()); }, rank, "gather_from_all_ranks");
  std::optional<std::vector<R>> out;
  if (values) {
    out.emplace();
    for (const auto& v : *values) out->push_back(from_ivalue<R>(v));
  }
  return out;
}

// gather_from_all_ranks for numbers (int, int64_t, float, double, bool, ...).
template <class F>
auto gather_scalar_from_all_ranks(F&& fn, int rank = 0) {
  using R = std::decay_t<std::invoke_result_t<F>>;
  static_assert(std::is_arithmetic_v<R>, "gather_scalar_from_all_ranks: fn must return a number");
  return gather_from_all_ranks(std::forward<F>(fn), rank);
}

// Collective: fn1 on every rank; rank 0 runs fn2 on the gathered values (std::vector, rank
// order); every rank returns fn2's result. Failures of either reach every rank.
template <class F1, class F2>
auto reduce_and_broadcast(F1&& fn1, F2&& fn2) {
  using R1 = std::decay_t<std::invoke_result_t<F1>>;
  auto gathered = gather_from_all_ranks(std::forward<F1>(fn1), 0);
  return compute_and_broadcast([&] { return fn2(std::vector<R1>(std::move(*gathered))); }, 0);
}

}  // namespace axolotl
}  // namespace chorus
