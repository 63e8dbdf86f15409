// The one error hierarchy of chorus. Every failure a user can reach is one of these, and its
// message names the operation, the group, the ranks and the sizes involved.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus {

// Root of everything chorus throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad input on this rank, detected before communicating.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A deadline passed. missing_ranks() are the ranks that did not arrive; operation() what they
// were expected in.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, std::vector<int> missing_ranks, std::string operation)
      : Error(what), missing_ranks_(std::move(missing_ranks)), operation_(std::move(operation)) {}
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }
  const std::string& operation() const { return operation_; }

 private:
  std::vector<int> missing_ranks_;
  std::string operation_;
};

// A peer died or left the group while others were waiting for it.
class PeerFailure : public Error {
 public:
  PeerFailure(const std::string& what, int failed_rank) : Error(what), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
};

// Ranks called different collectives, or the same one with different arguments.
// calls()[r] describes what rank r called.
class CollectiveMismatch : public Error {
 public:
  CollectiveMismatch(const std::string& what, std::vector<std::string> calls) : Error(what), calls_(std::move(calls)) {}
  const std::vector<std::string>& calls() const { return calls_; }

 private:
  std::vector<std::string> calls_;
};

// The rendezvous store failed: unreachable, protocol error, or a key that never appeared.
class StoreError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void enforce_failed(const char* file, int line, const char* cond, const std::string& detail);
}  // namespace detail

}  // namespace chorus

// Internal invariant: throws chorus::Error naming the condition, both sides' values when given,
// and the source location. Not for user input (that is InvalidArgument with a full sentence).
#define CHORUS_ENFORCE(cond, ...)                                                                \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::chorus::detail::enforce_failed(__FILE__, __LINE__, #cond,                                \
                                       ::chorus::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
#define CHORUS_ENFORCE_EQ(a, b) CHORUS_ENFORCE((a) == (b), #a " = ", (a), ", " #b " = ", (b))
