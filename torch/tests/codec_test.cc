// The object codec alone, in one process (Note [Object encoding]): round trips, and headers that
// arrive truncated or corrupt, which must raise chorus::Error naming the problem, never crash,
// allocate without bound, or leak another library's exception.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "chorus/chorus.h"
#include "parallel/objects/codec.h"

namespace chorus::detail {
namespace {

c10::IValue sample() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("weights", torch::arange(6, torch::kFloat).reshape({2, 3}));
  d.insert("steps", int64_t(7));
  d.insert("names", c10::List<std::string>({"a", "bc"}));
  d.insert("pair", c10::ivalue::Tuple::create({c10::IValue(2.5), c10::IValue(torch::ones({4}, torch::kLong))}));
  return d;
}

// What decoding `header` does: "ok", "error: <message>", or "other: <message>" for anything that
// is not a chorus::Error.
std::string decode(std::string_view header, const std::vector<at::Tensor>& tensors) {
  try {
    auto allocated = allocate_tensors(header);
    decode_object(header, allocated.size() == tensors.size() ? tensors : allocated);
    return "ok";
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
}

TEST(Codec, RoundTripKeepsValuesAndTypes) {
  const c10::IValue value = sample();
  Encoded e = encode_object(value);
  ASSERT_EQ(e.tensors.size(), 2u);
  c10::IValue back = decode_object(e.header, e.tensors);
  auto d = back.toGenericDict();
  EXPECT_TRUE(d.at("weights").toTensor().equal(torch::arange(6, torch::kFloat).reshape({2, 3})));
  EXPECT_EQ(d.at("steps").toInt(), 7);
  EXPECT_EQ(d.at("names").toList().get(1).toStringRef(), "bc");
  EXPECT_EQ(d.at("pair").toTupleRef().elements()[0].toDouble(), 2.5);
  EXPECT_EQ(back.type()->annotation_str(), value.type()->annotation_str());
}

TEST(Codec, EveryTruncatedHeaderRaisesAChorusError) {
  Encoded e = encode_object(sample());
  for (size_t n = 0; n < e.header.size(); ++n) {
    const std::string result = decode(std::string_view(e.header).substr(0, n), e.tensors);
    EXPECT_EQ(result.rfind("error: ", 0), 0u) << "prefix of " << n << " bytes: " << result;
    if (n > 0) {
      EXPECT_NE(result.find("corrupt"), std::string::npos) << result;
    }
  }
}

TEST(Codec, CorruptBytesDecodeOrRaiseAChorusErrorNeverAnythingElse) {
  Encoded e = encode_object(sample());
  for (size_t i = 0; i < e.header.size(); ++i)
    for (uint8_t bad : {uint8_t(0x00), uint8_t(0x7f), uint8_t(0x80), uint8_t(0xff)}) {
      std::string header = e.header;
      header[i] = char(bad);
      const std::string result = decode(header, e.tensors);
      EXPECT_TRUE(result == "ok" || result.rfind("error: ", 0) == 0)
          << "byte " << i << " set to " << int(bad) << ": " << result;
    }
}

TEST(Codec, AHugeCountIsRefusedBeforeAllocating) {
  // A value header: no tensors, then a list of Any claiming 2^62 items.
  std::string header = {'V', 0, 'l', 'A'};
  for (int i = 0; i < 8; ++i) header.push_back(char(0xff));
  header.push_back(char(0x3f));
  const std::string result = decode(header, {});
  EXPECT_NE(result.find("corrupt (truncated"), std::string::npos) << result;
}

TEST(Codec, NestingIsBounded) {
  std::string header = {'V', 0, 'l'};
  header.append(5000, 'l');  // a list of lists of lists ... as the element type
  header.push_back('A');
  const std::string result = decode(header, {});
  EXPECT_NE(result.find("nested deeper than 1000 levels"), std::string::npos) << result;
}

TEST(Codec, TensorTableIsChecked) {
  // One tensor of dtype code 200, then one of f32 with a negative size.
  const std::string bad_dtype = {'V', 1, char(200), 0, 0, 'N'};
  EXPECT_NE(decode(bad_dtype, {}).find("unknown tensor dtype"), std::string::npos) << decode(bad_dtype, {});
  const std::string negative = {'V', 1, char(at::ScalarType::Float), 0, 1, 1 /* sint -1 */, 'N'};
  EXPECT_NE(decode(negative, {}).find("negative tensor size"), std::string::npos) << decode(negative, {});
  // A value that names a tensor the table does not have.
  const std::string index = {'V', 0, 't', 3};
  EXPECT_NE(decode(index, {}).find("tensor index out of range"), std::string::npos) << decode(index, {});
}

TEST(Codec, ErrorHeadersCarryTheSendersMessage) {
  const std::string header = encode_error("rank 0: out of memory");
  ASSERT_TRUE(header_error(header));
  EXPECT_EQ(*header_error(header), "rank 0: out of memory");
  EXPECT_FALSE(header_error(encode_object(c10::IValue(int64_t(1))).header));
}

TEST(Codec, UnmovableLeavesAreNamed) {
  auto sparse = torch::eye(3).to_sparse();
  try {
    encode_object(c10::IValue(sparse));
    FAIL() << "a sparse tensor was encoded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("to_dense"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace chorus::detail
