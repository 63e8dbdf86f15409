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
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got));
    else
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
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

// The vector and scalar kernel builds agree bit for bit, for every dtype and op, and a second
// destination (reduce::Copy, streamed or not, at any alignment) receives the same bits.
TEST(ReduceKernels, IsaBuildsAgree) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no AVX2/F16C here";
  using Fn = void (*)(DataType, ReduceOp, const void* const*, int, void*, size_t, reduce::Copy);
  std::vector<std::pair<const char*, Fn>> builds{{"avx2", &reduce::reduce_avx2}};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    builds.emplace_back("avx512", &reduce::reduce_avx512);
  for (DataType dt : kAllDataTypes)
    for (ReduceOp op : kAllReduceOps) {
      if (!reduce_op_problem(dt, op).empty()) continue;
      const size_t n = 3100;  // several kernel blocks and a ragged tail
      std::vector<std::vector<uint8_t>> in;
      std::vector<const void*> srcs;
      for (int p = 0; p < 3; ++p) {
        in.push_back(
            test::make_buffer(dt, n, [&](size_t i) { return test::value(dt, op, p, i, 11) / 3.0 * (i % 2 ? 1 : 7); }));
        srcs.push_back(in.back().data());
      }
      const size_t bytes = n * element_size(dt);
      std::vector<uint8_t> want(bytes);
      reduce::reduce_generic(dt, op, srcs.data(), 3, want.data(), n, {});
      for (auto [name, fn] : builds)
        for (size_t shift : {size_t(0), size_t(8), size_t(1)})  // the copy's alignment
          for (bool stream : {false, true}) {
            const std::string what = detail::concat(to_string(dt), " ", to_string(op), " ", name, " copy at +", shift,
                                                    stream ? " streamed" : "");
            std::vector<uint8_t> got(bytes), copy(bytes + 128);
            uint8_t* to = copy.data() + (64 - reinterpret_cast<uintptr_t>(copy.data()) % 64) % 64 + shift;
            fn(dt, op, srcs.data(), 3, got.data(), n, {to, stream});
            EXPECT_EQ(got, want) << what;
            EXPECT_EQ(std::vector<uint8_t>(to, to + bytes), want) << what;
          }
      std::vector<uint8_t> plain(bytes);
      reduce::reduce_avx2(dt, op, srcs.data(), 3, plain.data(), n, {});
      EXPECT_EQ(plain, want) << to_string(dt) << " " << to_string(op) << " avx2 without a copy";
    }
}

}  // namespace
}  // namespace chorus
