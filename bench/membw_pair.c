/* The memory floor when ranks copy at once: N processes (default 2) each memcpy 64 MiB between
   buffers of their own, all starting together; prints the best round's time of the slowest one.
   peers/membw.c times one core alone; every rank of a collective copies at the same
   time as its peers, sharing the caches and the memory bus: this tells whether each core keeps its
   own speed when the others copy too. bench/compare.py prints both.
   Build: gcc -O3 -march=native membw_pair.c -o membw_pair; run: membw_pair [N]
   Prints: "<bytes> memcpy, <N> at once: <us> us (<GB/s> GB/s each)" */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

enum { kRounds = 20, kMaxProcs = 64 };

struct Shared {
  atomic_int arrived[kRounds];
  double took[kRounds][kMaxProcs];
};

int main(int argc, char** argv) {
  const int procs = argc > 1 ? atoi(argv[1]) : 2;
  if (procs < 1 || procs > kMaxProcs) {
    fprintf(stderr, "membw_pair: N must be in [1, %d]\n", kMaxProcs);
    return 2;
  }
  const size_t bytes = (size_t)64 << 20;
  struct Shared* sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  memset(sh, 0, sizeof *sh);
  for (int p = 0; p < procs; p++) {
    if (fork() != 0) continue;
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, p + 1, bytes);
    memset(b, 0, bytes);
    for (int r = 0; r < kRounds; r++) {
      atomic_fetch_add(&sh->arrived[r], 1);
      while (atomic_load(&sh->arrived[r]) < procs) sched_yield();
      const double t0 = now_us();
      memcpy(b, a, bytes);
      sh->took[r][p] = now_us() - t0;
      a[r] ^= b[bytes - 1 - r]; /* keeps the copy from being optimised away */
    }
    _exit(0);
  }
  for (int p = 0; p < procs; p++) wait(NULL);
  double best = 1e18;
  for (int r = 0; r < kRounds; r++) {
    double slowest = 0;
    for (int p = 0; p < procs; p++) slowest = sh->took[r][p] > slowest ? sh->took[r][p] : slowest;
    best = slowest < best ? slowest : best;
  }
  printf("%zu memcpy, %d at once: %.0f us (%.2f GB/s each)\n", bytes, procs, best, bytes / best / 1e3);
  return 0;
}
