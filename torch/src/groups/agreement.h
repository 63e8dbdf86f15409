// How the ranks of a group agree before they act (Note [Agreement] in agreement.cc).
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "chorus/core/communicator.h"

namespace chorus::detail {

// Every rank's `text` (all_gather_v of its bytes). Collective.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text);

// CollectiveMismatch on every rank unless every rank passed the same `text`. When they did, the
// cost is one all_gather of 8 bytes. `what` names the call, `rule` what the ranks had to share.
void require_same(Communicator& comm, const std::string& what, const std::string& rule, const std::string& text);

// The CollectiveMismatch of `what` on `comm` when the ranks' `texts` (one per rank) broke `rule`:
// "<what> on group '<name>': <rule>:" then a line per rank (Note [Agreement]).
[[noreturn]] void throw_mismatch(Communicator& comm, const std::string& what, const std::string& rule,
                                 std::vector<std::string> texts);

// What running user code left behind (every exception caught, as DCP's _DistWrapper: a rank
// that escaped with an unknown exception would leave the others waiting in the next exchange).
struct Caught {
  std::exception_ptr error;  // null: it returned
  std::string message;       // its what(), or a sentence for a non-std::exception
  bool invalid_argument = false;
  explicit operator bool() const { return error != nullptr; }
};
Caught run_caught(const std::function<void()>& fn);

// Runs fn on every rank, then the ranks fail together: when it threw on any rank, every rank
// throws the first failing rank's error (InvalidArgument stays InvalidArgument, anything else
// becomes Error) naming the ranks it failed on. Collective, also when fn throws.
void fail_together(Communicator& comm, const std::function<void()>& fn);

}  // namespace chorus::detail
