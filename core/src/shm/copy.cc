#include "shm/copy.h"

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace chorus::shm {

namespace {
#if defined(__x86_64__)
__attribute__((target("avx2"))) void stream_avx2(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t head = (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: finish them before anything else
}

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif
}  // namespace

void copy_out(void* dst, const void* src, size_t n, bool stream) {
  if (n == 0) return;
#if defined(__x86_64__)
  static const bool avx2 = has_avx2();
  if (stream && avx2 && n >= 4096) return stream_avx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
#endif
  std::memcpy(dst, src, n);
}

}  // namespace chorus::shm
