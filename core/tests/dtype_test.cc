#include <gtest/gtest.h>

#include "chorus/core/dtype.h"
#include "chorus/core/error.h"
#include "reduce/half.h"
#include "reduce/reduce_kernels.h"
#include "test_values.h"

namespace chorus {
namespace {

TEST(ReduceOpNames, ParseEveryAlias) {
  EXPECT_EQ(parse_reduce_op("sum"), ReduceOp::Sum);
  EXPECT_EQ(parse_reduce_op("MEAN"), ReduceOp::Mean);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::Mean);
  EXPECT_EQ(parse_reduce_op("prod"), ReduceOp::Product);
  EXPECT_EQ(parse_reduce_op("Product"), ReduceOp::Product);
  EXPECT_EQ(parse_reduce_op("min"), ReduceOp::Min);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::Max);
  EXPECT_EQ(parse_reduce_op("band"), ReduceOp::BitwiseAnd);
  EXPECT_EQ(parse_reduce_op("bor"), ReduceOp::BitwiseOr);
  EXPECT_EQ(parse_reduce_op("BXOR"), ReduceOp::BitwiseXor);
  try {
    parse_reduce_op("median");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("median"), std::string::npos);
  }
}

TEST(ReduceOpProblems, MeanOnIntegersAndBitwiseOnFloats) {
  EXPECT_NE(reduce_op_problem(DataType::Int32, ReduceOp::Mean).find("truncate"), std::string::npos);
  EXPECT_NE(reduce_op_problem(DataType::Float16, ReduceOp::BitwiseXor).find("floating"), std::string::npos);
  EXPECT_TRUE(reduce_op_problem(DataType::Float32, ReduceOp::Mean).empty());
  EXPECT_TRUE(reduce_op_problem(DataType::Bool, ReduceOp::BitwiseAnd).empty());
}

// Our f16 conversions against the compiler's, for every half value and a sweep of floats.
TEST(HalfConversion, MatchesCompilerForAllHalvesAndManyFloats) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 x;
    uint16_t bits = uint16_t(h);
    std::memcpy(&x, &bits, 2);
    float want = float(x);
    float got = reduce::half_to_float(bits);
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got));
    else EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
  }
  for (uint64_t i = 0; i < 2000000; ++i) {
    uint32_t bits = uint32_t(test::mix(i, 7, 9));
    if (i % 2) bits = (bits & 0x8fffffffu) | 0x30000000u;  // many in and near half's range
    float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    _Float16 want = _Float16(f);
    uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    ASSERT_EQ(reduce::float_to_half(f), want_bits) << f;
  }
}

TEST(BFloat16Conversion, MatchesNearestEven) {
  for (uint64_t i = 0; i < 2000000; ++i) {
    float f = std::bit_cast<float>(uint32_t(test::mix(i, 3, 5)));
    if (std::isnan(f) || std::isinf(f) || std::fabs(f) > 3e38f) continue;
    ASSERT_EQ(reduce::float_to_bf16(f), test::ref_bf16(f)) << f;
  }
  EXPECT_EQ(reduce::bf16_to_float(0x3f80), 1.0f);
}

// The vector and scalar kernel builds agree bit for bit, for every dtype and op.
TEST(ReduceKernels, IsaBuildsAgree) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no AVX2/F16C here";
  for (DataType dt : kAllDataTypes)
    for (ReduceOp op : kAllReduceOps) {
      if (!reduce_op_problem(dt, op).empty()) continue;
      const size_t n = 1031;
      std::vector<std::vector<uint8_t>> in;
      std::vector<const void*> srcs;
      for (int p = 0; p < 3; ++p) {
        in.push_back(test::make_buffer(dt, n, [&](size_t i) { return test::value(dt, op, p, i, 11) / 3.0 * (i % 2 ? 1 : 7); }));
        srcs.push_back(in.back().data());
      }
      std::vector<uint8_t> a(n * element_size(dt)), b(a.size());
      reduce::reduce_generic(dt, op, srcs.data(), 3, a.data(), n);
      reduce::reduce_avx2(dt, op, srcs.data(), 3, b.data(), n);
      EXPECT_EQ(a, b) << to_string(dt) << " " << to_string(op);
    }
}

}  // namespace
}  // namespace chorus
