#include "abort_cause.h"

#include "call_compare.h"
#include "chorus/core/error.h"

namespace chorus {

AbortCause abort_cause(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return {AbortKind::Timeout, e.missing_ranks().empty() ? -1 : e.missing_ranks().front(), e.what()};
  } catch (const PeerFailure& e) {
    return {AbortKind::PeerFailure, e.failed_rank(), e.what()};
  } catch (const CollectiveMismatch& e) {
    return {AbortKind::Mismatch, -1, e.what()};
  } catch (const std::exception& e) {
    return {AbortKind::Other, -1, e.what()};
  }
}

void raise_peer_abort(const AbortCause& cause, int from, const std::string& what, const std::string& group) {
  raise_as(cause, detail::concat(what, " on group '", group, "': rank ", from, " gave up first: ", cause.text), what);
}

void raise_as(const AbortCause& cause, const std::string& msg, const std::string& what) {
  switch (cause.kind) {
    case AbortKind::Timeout: throw TimeoutError(msg, {cause.about}, what);
    case AbortKind::PeerFailure: throw PeerFailure(msg, cause.about);
    case AbortKind::Mismatch: throw CollectiveMismatch(msg, calls_in_mismatch_report(cause.text));
    default: throw Error(msg);
  }
}

}  // namespace chorus
