// Objects (any c10::IValue) between the ranks of a group (Note [Object encoding]), and the
// leader-runs-then-tells-everyone pattern on top of it.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <vector>

#include "chorus/process_group.h"

namespace chorus::detail {

// Collective: `produce` runs on src only; its value reaches every rank. If it throws (or its
// value cannot be moved), src rethrows and every other rank raises Error with src's message.
c10::IValue broadcast_value(ProcessGroup& g, int src, const std::function<c10::IValue()>& produce, const char* what);

// Collective: every rank's `produce()`, in rank order, on dst (dst < 0: on every rank); nullopt
// elsewhere. If it throws on any rank, every rank raises (the thrower rethrows its own).
std::optional<std::vector<c10::IValue>> gather_values(ProcessGroup& g, int dst,
                                                      const std::function<c10::IValue()>& produce, const char* what);

// Collective: leaders run fn first; the others run it after every leader succeeded. A leader's
// failure reaches every rank as an Error carrying its message (the leader rethrows its own).
void leaders_first(ProcessGroup& g, bool leader, const std::function<void()>& fn, const char* what);

}  // namespace chorus::detail
