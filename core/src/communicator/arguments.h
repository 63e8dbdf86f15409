// Argument validation: the local half of checking a call, on this rank alone, before any
// communication. (The cross-rank half, comparing the ranks' calls, is Note [Comparing calls].)
//
// Note [Invalid arguments travel]: a rank whose arguments are bad does not throw at once: its
// peers would wait for it until their deadline. It records why in Call::invalid and still takes
// its place in the call's first step, where every rank learns of it and raises InvalidArgument
// carrying this rank's message. So validation never throws; it fills Call::invalid.
#pragma once

#include <string>

#include "call.h"

namespace chorus {

// Validates the arguments of `call` as this rank passed them (rank `rank` of a group of `size`
// named `group`), for every kind of call: dtype and op, roots and peers, buffers that must not be
// null, lengths of per-rank counts, and overlap of input and output (only the documented in-place
// forms may overlap). On the first problem sets call.invalid to a message that names the call,
// the group, the rank and what to do (Note [Invalid arguments travel]). Never throws.
void validate_arguments(Call& call, int rank, int size, const std::string& group);

}  // namespace chorus
