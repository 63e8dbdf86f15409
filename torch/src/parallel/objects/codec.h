// Note [Object encoding]
// Objects (any c10::IValue) travel as a small header plus the raw bytes of their tensors: the
// header holds each tensor's dtype and shape and the value's structure with exact container
// types (typed lists and dicts, named tuples keep their names); tensors are referenced by index
// and their bytes move with the core's collectives straight from and into tensor memory, never
// through a pickler. Leaves the header has no tag for (custom classes and other rarities) are
// pickled with torch's pickler, their tensors still out of band.
// A header may instead carry an error: the sender failed, and every receiver raises it.
#pragma once

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::detail {

struct Encoded {
  std::string header;
  std::vector<at::Tensor> tensors;  // contiguous CPU tensors, in the order the header lists them
  size_t tensor_bytes() const;
};

// Throws InvalidArgument naming a leaf that cannot be moved.
Encoded encode_object(const c10::IValue& value);
// A header that says: the sender failed with `message`.
std::string encode_error(const std::string& message);
// The sender's error message, when the header carries one.
std::optional<std::string> header_error(std::string_view header);
// The tensors a header describes, allocated for their bytes to be received into.
std::vector<at::Tensor> allocate_tensors(std::string_view header);
c10::IValue decode_object(std::string_view header, const std::vector<at::Tensor>& tensors);

}  // namespace chorus::detail
