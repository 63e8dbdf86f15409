// Internals shared by the collection walkers.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace chorus::detail {

// The element type for new items of a container typed `old`: `old` when every item fits it,
// else the items' unified type, else Any.
c10::TypePtr item_type(const c10::TypePtr& old, const std::vector<c10::IValue>& items);

}  // namespace chorus::detail
