// Copies out of shared memory (shm/copy.h): what streaming copies write, and from which size a
// call streams them (Note [Streaming stores]).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shm/copy.h"

namespace chorus::test {
namespace {

// Streaming or not, every byte lands where memcpy would put it, from any alignment of the
// destination (the streamed bulk starts at the vector width) and with any tail.
TEST(CopyOut, WritesWhatMemcpyWould) {
  std::vector<uint8_t> src(70000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
  for (bool stream : {false, true})
    for (size_t offset : {0, 1, 31, 33, 64})
      for (size_t n : {size_t(0), size_t(100), size_t(4096), size_t(4097), size_t(65536 + 77)}) {
        std::vector<uint8_t> dst(n + offset + 16, 0xEE);
        shm::copy_out(dst.data() + offset, src.data() + 3, n, stream);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= offset && i < offset + n;
          ASSERT_EQ(dst[i], inside ? src[i - offset + 3] : 0xEE)
              << "stream " << stream << ", offset " << offset << ", " << n << " bytes, byte " << i;
        }
      }
}

// kStreamGroupBytes, or less where the CPU reports a small last-level cache.
TEST(CopyOut, StreamsFromWhatTheCachesCannotHold) {
  EXPECT_EQ(shm::stream_group_bytes(0), shm::kStreamGroupBytes);                  // none reported
  EXPECT_EQ(shm::stream_group_bytes(size_t(32) << 20), size_t(80) << 20);         // the Zen 4 VM's 32 MiB
  EXPECT_EQ(shm::stream_group_bytes(size_t(480) << 20), shm::kStreamGroupBytes);  // the Xeon VM's host's
  EXPECT_FALSE(shm::streams_out(shm::kStreamMinBytes - 1, size_t(1) << 40));      // small messages never
  EXPECT_TRUE(shm::streams_out(shm::kStreamMinBytes, shm::kStreamGroupBytes));
  EXPECT_FALSE(shm::streams_out(size_t(16) << 20, shm::stream_group_bytes() - 1));
}

}  // namespace
}  // namespace chorus::test
