#include "chorus/core/dtype.h"

#include <algorithm>
#include <cctype>

#include "chorus/core/error.h"

namespace chorus {

size_t element_size(DataType dtype) {
  switch (dtype) {
    case DataType::Float64:
    case DataType::Int64: return 8;
    case DataType::Float32:
    case DataType::Int32: return 4;
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Int16: return 2;
    case DataType::Int8:
    case DataType::UInt8:
    case DataType::Bool: return 1;
  }
  throw InvalidArgument(detail::concat("unknown dtype code ", int(dtype)));
}

std::string_view to_string(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return "f32";
    case DataType::Float64: return "f64";
    case DataType::Float16: return "f16";
    case DataType::BFloat16: return "bf16";
    case DataType::Int8: return "i8";
    case DataType::UInt8: return "u8";
    case DataType::Int16: return "i16";
    case DataType::Int32: return "i32";
    case DataType::Int64: return "i64";
    case DataType::Bool: return "bool";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Product: return "product";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::BitwiseAnd: return "band";
    case ReduceOp::BitwiseOr: return "bor";
    case ReduceOp::BitwiseXor: return "bxor";
  }
  return "?";
}

bool is_floating(DataType dtype) {
  return dtype == DataType::Float32 || dtype == DataType::Float64 || dtype == DataType::Float16 ||
         dtype == DataType::BFloat16;
}

ReduceOp parse_reduce_op(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "sum") return ReduceOp::Sum;
  if (s == "mean" || s == "avg") return ReduceOp::Mean;
  if (s == "prod" || s == "product") return ReduceOp::Product;
  if (s == "min") return ReduceOp::Min;
  if (s == "max") return ReduceOp::Max;
  if (s == "band" || s == "bitwise_and") return ReduceOp::BitwiseAnd;
  if (s == "bor" || s == "bitwise_or") return ReduceOp::BitwiseOr;
  if (s == "bxor" || s == "bitwise_xor") return ReduceOp::BitwiseXor;
  throw InvalidArgument(detail::concat("unknown reduction '", name,
                                       "': use sum, mean (avg), prod (product), min, max, band, bor or bxor"));
}

std::string reduce_op_problem(DataType dtype, ReduceOp op) {
  bool bitwise = op == ReduceOp::BitwiseAnd || op == ReduceOp::BitwiseOr || op == ReduceOp::BitwiseXor;
  if (bitwise && is_floating(dtype))
    return detail::concat("bitwise reduction '", to_string(op), "' is not defined on floating type ", to_string(dtype),
                          ": use an integer or bool buffer");
  if (op == ReduceOp::Mean && !is_floating(dtype))
    return detail::concat("mean of ", to_string(dtype),
                          " would truncate: reduce with sum and divide, or convert to a floating type first");
  return {};
}

}  // namespace chorus
