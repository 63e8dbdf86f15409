/* The physical yardstick: how fast one core copies memory. For 1, 16 and 64 MiB, the best time of
   a memcpy between two buffers and of a float a += b over them, as GB/s of the buffer's size (and
   of all the bytes that moved: read and write for memcpy, three streams for a += b). An
   all_reduce of N bytes on one core reads and writes at least that much, so bench/compare.py
   judges chorus against the 64 MiB memcpy.
   Build: gcc -O3 -march=native membw.c -o membw
   Prints per size: "<bytes> memcpy <GB/s> GB/s (read+write <GB/s>)  a+=b <GB/s> GB/s (3 streams <GB/s>)" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  const size_t sizes[] = {1u << 20, 16u << 20, 64u << 20};
  for (int s = 0; s < 3; ++s) {
    const size_t bytes = sizes[s], n = bytes / sizeof(float);
    float* src = malloc(bytes);
    float* dst = malloc(bytes);
    if (!src || !dst) return 1;
    memset(src, 1, bytes);  // touched: no page faults inside the timed loops
    memset(dst, 2, bytes);
    const int rounds = bytes < (16u << 20) ? 200 : 20;
    double copy = 1e9, add = 1e9;
    for (int r = 0; r < rounds; ++r) {
      double t = seconds();
      memcpy(dst, src, bytes);
      t = seconds() - t;
      if (t < copy) copy = t;
    }
    for (int r = 0; r < rounds; ++r) {
      double t = seconds();
      for (size_t i = 0; i < n; ++i) dst[i] += src[i];
      t = seconds() - t;
      if (t < add) add = t;
    }
    printf("%10zu memcpy %.2f GB/s (read+write %.2f)  a+=b %.2f GB/s (3 streams %.2f)\n", bytes, bytes / copy / 1e9,
           2 * bytes / copy / 1e9, bytes / add / 1e9, 3 * bytes / add / 1e9);
    if (dst[n / 2] == 12345.0f) puts("");  // keeps the additions
    free(src);
    free(dst);
  }
  return 0;
}
