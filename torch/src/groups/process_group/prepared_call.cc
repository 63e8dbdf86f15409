// The helpers the collectives' bodies share (prepared_call.h).
#include "groups/process_group/prepared_call.h"

namespace chorus::detail {

Buffer input(Communicator& comm, const at::Tensor& t, const char* op, std::optional<ReduceOp> reduce) {
  if (auto why = tensor_problem(t, reduce); !why.empty()) comm.reject(op, why);
  at::Tensor c = plain(t);
  return Buffer{c, core_type(c.scalar_type())->dtype, core_count(c)};
}

std::string output_problem(const at::Tensor& out, const at::Tensor& t, int64_t want, bool contiguous) {
  if (auto why = tensor_problem(out); !why.empty()) return concat("out: ", why);
  if (contiguous && !out.is_contiguous()) return concat("out must be contiguous, not ", describe(out));
  if (out.scalar_type() != t.scalar_type() || out.numel() != want)
    return concat("out is ", describe(out), " but must hold ", want, " elements of ", c10::toString(t.scalar_type()));
  return "";
}

std::string list_string(const std::vector<at::Tensor>& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i) s += concat(i ? ", " : "", describe(tensors[i]));
  return s;
}

}  // namespace chorus::detail
