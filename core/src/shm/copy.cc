#include "shm/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace chorus::shm {

namespace {
#if defined(__x86_64__)
// Streams the largest whole number of 128-byte blocks from src to dst (dst aligned to the
// vector width) and returns how many bytes that was.
using Bulk = size_t (*)(uint8_t* dst, const uint8_t* src, size_t n);

__attribute__((target("avx2"))) size_t bulk_avx2(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (size_t k = 0; k < 128; k += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + k),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + k)));
  return i;
}

// Whole-line stores: each fills a write-combining buffer at once.
__attribute__((target("avx512f"))) size_t bulk_avx512(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (size_t k = 0; k < 128; k += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + k), _mm512_loadu_si512(src + i + k));
  return i;
}

struct Streamer {
  Bulk bulk = nullptr;
  size_t align = 0;
};

Streamer pick_streamer() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {&bulk_avx512, 64};
  if (__builtin_cpu_supports("avx2")) return {&bulk_avx2, 32};
  return {};
}

// memcpy up to dst's alignment, the bulk streamed, memcpy of the tail.
void stream(const Streamer& s, uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t head = std::min(n, (s.align - reinterpret_cast<uintptr_t>(dst) % s.align) % s.align);
  std::memcpy(dst, src, head);
  const size_t done = head + s.bulk(dst + head, src + head, n - head);
  std::memcpy(dst + done, src + done, n - done);
  _mm_sfence();  // streaming stores are weakly ordered: finish them before anything else
}
#endif
}  // namespace

size_t stream_group_bytes(size_t last_level) {
  const size_t by_cache = size_t(kStreamLastLevel * double(last_level));
  return last_level > 0 ? std::min(kStreamGroupBytes, by_cache) : kStreamGroupBytes;
}

size_t stream_group_bytes() {
  static const size_t bytes = [] {
    size_t largest = 0;  // sysfs lists cpu0's caches as index0, index1, ..., sizes as "32768K"
    for (int i = 0;; ++i) {
      std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
      size_t n = 0;
      char unit = 0;
      if (!(f >> n)) break;
      f >> unit;
      largest = std::max(largest, n << (unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0));
    }
    return stream_group_bytes(largest);
  }();
  return bytes;
}

void copy_out(void* dst, const void* src, size_t n, bool stream) {
  if (n == 0) return;
#if defined(__x86_64__)
  static const Streamer streamer = pick_streamer();
  if (stream && streamer.bulk && n >= 4096)
    return shm::stream(streamer, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
#endif
  std::memcpy(dst, src, n);
}

}  // namespace chorus::shm
