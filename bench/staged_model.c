/* What chorus's all_reduce on ordinary buffers costs on this machine in copies and folds alone,
   without processes or waits: the bound it can meet, beside the floor of every rank copying
   64 MiB at once (bench/membw_pair.c).

   chorus's shared-memory all_reduce on ordinary buffers (core/src/shm/all_reduce.cc) goes in
   rounds, two ways. Two-shot (a CPU for every rank): in each round every rank copies the parts of
   its input that its peers fold into its slot, folds its own part from every rank's slot (its own
   input read where it is) into its output and its slot, and copies the others' folded parts of the
   round before out of their slots. Ring (more ranks than CPUs, Note [Ring through the slots]): a
   round's parts travel rank to rank, one step a phase; at step s rank r folds its input into part
   (r + s) mod W, read from rank r + 1's slot of the step before, into its own slot; after W steps
   every rank copies the whole parts out. This program does the same copies and folds of float
   sums, one thread per CPU running the ranks r with r % CPUs == its index in rank order, with a spin
   barrier where chorus's ranks meet: no process switches, no sleeping, no call checks. Each of its
   runs writes every input first, as chorus-bench does before each call. It also times every rank's
   64 MiB memcpy on the same threads, the floor for ranks copying at once.

   Build: gcc -O3 -march=native -pthread staged_model.c -o staged_model
   Run:   staged_model W [round KiB] [two-shot|ring]; the way defaults to chorus's (ring with more
          ranks than CPUs), the round to chorus's: for two-shot each rank's slot holds the round's W
          parts and its folded part, 512 KiB with a CPU for every rank, else 8 MiB / W within
          512 KiB-2 MiB (Note [Deep slots when ranks share cores]); a ring's round is 4 MiB.
   Prints: "<way> all_reduce model, W ranks on T CPUs, 67108864 B a rank, rounds of R KiB:
          best <us> us, median <us> us; every rank's memcpy at once: best <us> us" */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  kRuns = 9,
  kMaxRanks = 64,
  kLine = 16 /* floats in a cache line */,
  kBlock = 1024 /* floats folded at a time */
};
static const size_t kBytes = (size_t)64 << 20;

static int world, threads, cpus[kMaxRanks];        /* cpus: the CPU each thread runs on */
static size_t count, per_round, rounds, folded_at; /* in floats */
static float *in[kMaxRanks], *out[kMaxRanks], *slot[kMaxRanks][2];
static atomic_int arrived, generation;
static double took[kRuns];

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void barrier(void) {
  const int g = atomic_load(&generation);
  if (atomic_fetch_add(&arrived, 1) == threads - 1) {
    atomic_store(&arrived, 0);
    atomic_fetch_add(&generation, 1);
  } else {
    while (atomic_load(&generation) == g) _mm_pause();
  }
}

/* memcpy with streaming stores, as chorus copies into outputs of 4 MiB and more (where the CPU
   has AVX2, as chorus's do). */
static int has_avx2;
__attribute__((target("avx2"))) static void stream_copy(float* dst, const float* src, size_t n) {
  size_t i = ((32 - (uintptr_t)dst % 32) % 32) / sizeof(float); /* floats before dst's first 32-byte boundary */
  i = i < n ? i : n;
  memcpy(dst, src, i * sizeof(float));
  for (; has_avx2 && i + 32 <= n; i += 32)
    for (size_t k = 0; k < 32; k += 8) _mm256_stream_ps(dst + i + k, _mm256_loadu_ps(src + i + k));
  memcpy(dst + i, src + i, (n - i) * sizeof(float));
  if (has_avx2) _mm_sfence();
}

/* First element of rank q's part of round k. */
static size_t part_begin(size_t k, int q) {
  const size_t in_round = (k + 1) * per_round <= count ? per_round : count - k * per_round;
  return k * per_round + in_round * (size_t)q / (size_t)world;
}

static void fold(int me, size_t k, float* published) {
  const size_t b = part_begin(k, me), e = part_begin(k, me + 1);
  for (size_t x = b; x < e; x += kBlock) {
    const size_t m = e - x < kBlock ? e - x : kBlock;
    float* f = published + (x - b);
    for (int p = 0; p < world; p++) {
      const float* s = p == me ? in[me] + x : slot[p][(k + 1) & 1] + (x - k * per_round);
      if (p == 0)
        for (size_t i = 0; i < m; i++) f[i] = s[i];
      else
        for (size_t i = 0; i < m; i++) f[i] += s[i];
    }
    stream_copy(out[me] + x, f, m);
  }
}

static void* staged(void* arg) {
  const int t = (int)(long)arg;
  for (size_t k = 0; k <= rounds; k++) {
    for (int me = t; me < world && k < rounds; me += threads)
      for (int q = 0; q < world; q++) {
        const size_t b = part_begin(k, q), e = part_begin(k, q + 1);
        if (q != me) memcpy(slot[me][(k + 1) & 1] + (b - k * per_round), in[me] + b, (e - b) * sizeof(float));
      }
    barrier(); /* chorus's one phase a round */
    for (int me = t; me < world; me += threads) {
      if (k >= 1)
        for (int q = 0; q < world; q++) {
          const size_t b = part_begin(k - 1, q), e = part_begin(k - 1, q + 1);
          if (q != me) stream_copy(out[me] + b, slot[q][(k + 1) & 1] + folded_at, e - b);
        }
      if (k < rounds) fold(me, k, slot[me][k & 1] + folded_at);
    }
  }
  return NULL;
}

/* Note [Ring through the slots]: slot[r][(j + 1) & 1] holds rank r's partial sum of step j. */
static void* ring(void* arg) {
  const int t = (int)(long)arg;
  size_t step = 0;
  for (size_t k = 0; k <= rounds; k++) {
    for (int me = t; me < world && k >= 1; me += threads) /* round k-1's parts, each whole */
      for (int q = 0; q < world; q++) {
        const int p = (q + world - 1) % world; /* in q's slot; q == me kept it */
        const size_t b = part_begin(k - 1, p), e = part_begin(k - 1, p + 1);
        if (q != me) stream_copy(out[me] + b, slot[q][step & 1], e - b);
      }
    for (int s = 0; k < rounds && s < world; s++, step++) {
      for (int me = t; me < world; me += threads) {
        const int p = (me + s) % world;
        const size_t b = part_begin(k, p), e = part_begin(k, p + 1);
        float* mine = slot[me][(step + 1) & 1];
        if (s == 0) {
          memcpy(mine, in[me] + b, (e - b) * sizeof(float));
          continue;
        }
        const float* prev = slot[(me + 1) % world][step & 1];
        for (size_t x = 0; x < e - b; x += kBlock) {
          const size_t m = e - b - x < kBlock ? e - b - x : kBlock;
          for (size_t i = 0; i < m; i++) mine[x + i] = prev[x + i] + in[me][b + x + i];
          if (s == world - 1) stream_copy(out[me] + b + x, mine + x, m);
        }
      }
      barrier();
    }
  }
  return NULL;
}

static void* copies(void* arg) {
  for (int r = (int)(long)arg; r < world; r += threads) memcpy(out[r], in[r], kBytes);
  return NULL;
}

struct Thread {
  int index;
  void* (*work)(void*);
};

static void* pinned(void* arg) {
  const struct Thread* t = arg;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  CPU_SET(cpus[t->index], &mine);
  sched_setaffinity(0, sizeof mine, &mine);
  return t->work((void*)(long)t->index);
}

/* Writes every input, then times `work` on every thread: the slowest thread's time. */
static double run(void* (*work)(void*), int pass) {
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < count; i++) in[r][i] = (float)(((size_t)(r + pass) + i) & 7);
  pthread_t th[kMaxRanks];
  struct Thread args[kMaxRanks];
  const double t0 = now_us();
  for (int t = 0; t < threads; t++) {
    args[t] = (struct Thread){t, work};
    pthread_create(&th[t], NULL, pinned, &args[t]);
  }
  for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
  return now_us() - t0;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  world = argc > 1 ? atoi(argv[1]) : 2;
  if (world < 2 || world > kMaxRanks) {
    fprintf(stderr, "staged_model: W must be in [2, %d]\n", kMaxRanks);
    return 2;
  }
  __builtin_cpu_init();
  has_avx2 = __builtin_cpu_supports("avx2");
  cpu_set_t usable;
  sched_getaffinity(0, sizeof usable, &usable);
  threads = 0;
  for (int c = 0; c < CPU_SETSIZE && threads < world; c++)
    if (CPU_ISSET(c, &usable)) cpus[threads++] = c;
  const int rings = argc > 3 ? strcmp(argv[3], "ring") == 0 : threads < world;
  if (argc > 3 && !rings && strcmp(argv[3], "two-shot") != 0) {
    fprintf(stderr, "staged_model: the way is two-shot or ring, not '%s'\n", argv[3]);
    return 2;
  }
  size_t round_kib = threads >= world ? 512 : (8u << 10) / (size_t)world;
  round_kib = rings ? 4096 : round_kib < 512 ? 512 : round_kib > 2048 ? 2048 : round_kib;
  if (argc > 2) round_kib = (size_t)atoi(argv[2]);
  if (round_kib < 4) {
    fprintf(stderr, "staged_model: the round must be at least 4 KiB\n");
    return 2;
  }
  /* Two-shot: the slot holds the round's W parts and the rank's folded part; ring: the round is
     W parts, and a slot holds one. Each part is whole cache lines. */
  const size_t fit = (round_kib << 10) / ((size_t)(rings ? world : world + 1) * sizeof(float));
  const size_t part = fit / kLine * kLine;
  if (part == 0) {
    fprintf(stderr, "staged_model: a round of %zu KiB leaves no cache line for each of %d ranks\n", round_kib, world);
    return 2;
  }
  count = kBytes / sizeof(float);
  per_round = part * (size_t)world;
  folded_at = per_round;
  rounds = (count + per_round - 1) / per_round;
  for (int r = 0; r < world; r++) {
    in[r] = aligned_alloc(64, kBytes);
    out[r] = aligned_alloc(64, kBytes);
    for (int s = 0; s < 2; s++) slot[r][s] = aligned_alloc(64, (per_round + part) * sizeof(float));
    if (!in[r] || !out[r] || !slot[r][0] || !slot[r][1]) {
      fprintf(stderr, "staged_model: out of memory for %d ranks of %zu bytes\n", world, kBytes);
      return 1;
    }
    memset(out[r], 0, kBytes);
    for (int s = 0; s < 2; s++) memset(slot[r][s], 0, (per_round + part) * sizeof(float));
  }
  double floor_best = 1e18;
  for (int pass = 0; pass < kRuns; pass++) { /* interleaved, so both see the machine alike */
    const double c = run(copies, pass);
    floor_best = c < floor_best ? c : floor_best;
    took[pass] = run(rings ? ring : staged, pass);
  }
  for (int r = 0; r < world; r++) /* the model computed the sum, or it measured nothing */
    for (size_t i = 0; i < count; i += 4099) {
      float want = 0;
      for (int p = 0; p < world; p++) want += (float)(((size_t)(p + kRuns - 1) + i) & 7);
      if (out[r][i] != want) {
        fprintf(stderr, "staged_model: rank %d element %zu is %g, not %g\n", r, i, out[r][i], want);
        return 1;
      }
    }
  qsort(took, kRuns, sizeof took[0], by_value);
  printf(
      "%s all_reduce model, %d ranks on %d CPUs, %zu B a rank, rounds of %zu KiB: best %.0f us, median %.0f us; "
      "every rank's memcpy at once: best %.0f us\n",
      rings ? "ring" : "two-shot", world, threads, kBytes, round_kib, took[0], took[kRuns / 2], floor_best);
  return 0;
}
