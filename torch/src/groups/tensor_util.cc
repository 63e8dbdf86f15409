#include "groups/tensor_util.h"

namespace chorus::detail {

std::optional<CoreType> core_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return CoreType{DataType::Float32, 1};
    case at::kDouble: return CoreType{DataType::Float64, 1};
    case at::kHalf: return CoreType{DataType::Float16, 1};
    case at::kBFloat16: return CoreType{DataType::BFloat16, 1};
    case at::kChar: return CoreType{DataType::Int8, 1};
    case at::kByte: return CoreType{DataType::UInt8, 1};
    case at::kShort: return CoreType{DataType::Int16, 1};
    case at::kInt: return CoreType{DataType::Int32, 1};
    case at::kLong: return CoreType{DataType::Int64, 1};
    case at::kBool: return CoreType{DataType::Bool, 1};
    case at::kComplexFloat: return CoreType{DataType::Float32, 2};
    case at::kComplexDouble: return CoreType{DataType::Float64, 2};
    case at::kComplexHalf: return CoreType{DataType::Float16, 2};
    default: return std::nullopt;
  }
}

std::string shape_string(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += concat(i ? ", " : "", sizes[i]);
  return s + "]";
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return concat(c10::toString(t.scalar_type()), shape_string(t.sizes()));
}

std::string tensor_problem(const at::Tensor& t, std::optional<ReduceOp> op) {
  if (!t.defined()) return "the tensor is undefined: pass a tensor made with torch::empty/zeros/...";
  if (!t.device().is_cpu())
    return concat("the tensor is on ", t.device().str(),
                  " but this group moves CPU tensors: move it with t.to(torch::kCPU) (or fabric.to_device(t))");
  if (t.layout() != at::kStrided)
    return concat("the tensor has layout ", t.layout(), ": convert it with t.to_dense() first");
  auto core = core_type(t.scalar_type());
  if (!core)
    return concat("dtype ", c10::toString(t.scalar_type()),
                  " cannot be moved: use f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool or complex");
  if (op && core->per_element == 2 && *op != ReduceOp::Sum && *op != ReduceOp::Mean)
    return concat("complex tensors reduce with sum or mean only, not ", to_string(*op));
  if (op) return reduce_op_problem(core->dtype, *op);
  return "";
}

at::Tensor alias_of(const at::Tensor& base, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(base.storage_offset() + offset);
  return at::Tensor(std::move(impl));
}

at::Tensor alias_of(const at::Tensor& base, at::IntArrayRef sizes, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_sizes_contiguous(sizes);
  impl->set_storage_offset(base.storage_offset() + offset);
  return at::Tensor(std::move(impl));
}

}  // namespace chorus::detail
