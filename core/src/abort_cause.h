// Why a rank gave up on its group, in a form its peers read back (a shared-memory field, a
// store record), and the error they raise on reading it. Shared by every backend, so that a
// peer's abort reads the same whichever engine carried it.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace chorus {

enum class AbortKind : uint32_t { None = 0, Timeout, PeerFailure, Mismatch, Other };

struct AbortCause {
  AbortKind kind = AbortKind::Other;
  int about = -1;  // the rank the error names (the missing or failed one), or -1
  std::string text;
};

// The cause of `error`, the exception the giving-up rank raised.
AbortCause abort_cause(const std::exception_ptr& error);

// Throws what a peer raises when rank `from` gave up with `cause` while the peer was in `what`
// on group `group`: the same error type, naming the same rank.
[[noreturn]] void raise_peer_abort(const AbortCause& cause, int from, const std::string& what,
                                   const std::string& group);
// Throws `msg` as the error type of `cause` (`what`: the call, for a TimeoutError).
[[noreturn]] void raise_as(const AbortCause& cause, const std::string& msg, const std::string& what);

}  // namespace chorus
