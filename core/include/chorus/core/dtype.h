// Element types and reduction operations understood by the core, independent of torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus {

enum class DataType : uint8_t { Float32, Float64, Float16, BFloat16, Int8, UInt8, Int16, Int32, Int64, Bool };
inline constexpr DataType kAllDataTypes[] = {
    DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16, DataType::Int8,
    DataType::UInt8,   DataType::Int16,   DataType::Int32,   DataType::Int64,    DataType::Bool};

enum class ReduceOp : uint8_t { Sum, Mean, Product, Min, Max, BitwiseAnd, BitwiseOr, BitwiseXor };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::Sum,       ReduceOp::Mean,      ReduceOp::Product,
                                             ReduceOp::Min,       ReduceOp::Max,       ReduceOp::BitwiseAnd,
                                             ReduceOp::BitwiseOr, ReduceOp::BitwiseXor};

size_t element_size(DataType dtype);
std::string_view to_string(DataType dtype);
std::string_view to_string(ReduceOp op);
bool is_floating(DataType dtype);  // f32 f64 f16 bf16

// "sum" "mean" "avg" "prod" "product" "min" "max" "band" "bor" "bxor" (also "bitwise_and" ...),
// case-insensitive. Throws InvalidArgument listing the accepted names.
ReduceOp parse_reduce_op(std::string_view name);

// Empty when `op` can reduce `dtype`; otherwise a sentence saying why not and what to do instead
// (mean on integers, bitwise ops on floating types).
std::string reduce_op_problem(DataType dtype, ReduceOp op);

}  // namespace chorus
