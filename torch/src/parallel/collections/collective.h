// Collectives on collections (Note [Collection collectives]).
#pragma once

#include <ATen/core/ivalue.h>

#include <optional>

#include "chorus/process_group.h"

namespace chorus::detail {

// Every tensor and number leaf reduced over the group (numbers come back as numbers of their
// type); strings and None kept as they are.
c10::IValue all_reduce_collection(ProcessGroup& g, const c10::IValue& data, ReduceOp op, const char* what);
// Every tensor and number leaf stacked over the group: (size(), *shape).
c10::IValue all_gather_collection(ProcessGroup& g, const c10::IValue& data, const char* what);
// Every tensor leaf concatenated along dim 0 over the group (0-d leaves as 1 row; dim 0 may
// differ between ranks), on dst; nullopt elsewhere.
std::optional<c10::IValue> gather_collection(ProcessGroup& g, const c10::IValue& data, int dst, const char* what);

}  // namespace chorus::detail
