/* Open MPI's collectives timed one call at a time, for bench/compare.py: rank 0's median and 95th
   percentile per op and size, with chorus-bench's iteration and warm-up counts, percentile rule
   and barriers before and after each call (peers/mpi_collectives.c prints medians only).
   With --fresh, each rank writes its input before every call, as chorus-bench does (and a
   broadcast's receivers overwrite their buffer): a training step's tensors are always new. The
   anchor never writes its buffers again, so from the second call on a peer's data is already in
   the reader's cache, and Open MPI's single copy (it reads the peer's buffer through the kernel)
   moves nothing between cores.
   The barrier is timed as the anchor times it (1000 calls back to back), with the mean too: with
   more ranks than cores rank 0's barrier times split in two groups and the median lands on
   either (see bench/chorus_bench.cc).
   With --step-matmul N (built with -DCHORUS_STEP_LOAD and linked to build/bench's
   libchorus_step_load), each rank runs chorus-bench's step before every call: an N x N float
   matmul on --step-threads (2) intra-op threads of torch (bench/step_load.cc).
   --ops and --sizes (comma-separated, as chorus-bench takes them) time only those ops (barrier,
   all_reduce, all_gather, broadcast) and sizes (of 8, 1024, 65536, 1048576, 16777216, 67108864):
   bench/compare.py times a few sizes at a time, one side after the other, and bench/states.py the
   small ones only.
   With --tail, 400 timed calls up to 1 MiB and 40 beyond, as chorus-bench --tail: a p95 beside a
   busy core that one time slice does not decide (chorus-bench's Note [A p95 beside busy cores]).
   With --last-rank each call's time is that of the rank that finished it last (chorus-bench
   --last-rank), not rank 0's: a broadcast's root returns once its message is handed on, which in
   Open MPI's chain is long before the chain's end has it.
   Build: mpicc -O2 mpi_tail.c -o mpi_tail; run: mpirun -np N mpi_tail [--fresh] [--last-rank] [--step-matmul N]
   [--ops LIST] [--sizes LIST] [--tail]
   Prints: op bytes median_us p95_us mean_us */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef CHORUS_STEP_LOAD
#include "step_load.h"
#endif

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double at_fraction(double* v, int n, double f) {
  qsort(v, n, sizeof(double), by_value);
  const int k = (int)(f * n);
  return v[k < n - 1 ? k : n - 1];
}

/* rank 0's line for one op and size: median, p95 and mean of the n times. */
static void report(const char* op, long bytes, double* times, int n) {
  double mean = 0;
  for (int i = 0; i < n; i++) mean += times[i] / n;
  const double p95 = at_fraction(times, n, 0.95), median = at_fraction(times, n, 0.5);
  printf("%s %ld %.2f %.2f %.2f\n", op, bytes, median, p95, mean);
}

enum { kAllReduce, kAllGather, kBroadcast, kBarrier };
static const char* const kNames[] = {"all_reduce", "all_gather", "broadcast", "barrier"};
static const long kSizes[] = {8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20};

/* A comma-separated list of `n` names (or of the sizes' decimal values, with `sizes`) -> the bits
   of the entries it names; exits naming an entry it does not know. */
static unsigned parse_list(const char* list, const char* flag, int sizes, int n) {
  unsigned bits = 0;
  char* copy = strdup(list);
  for (char* item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
    int k = 0;
    while (k < n && (sizes ? atol(item) != kSizes[k] : strcmp(item, kNames[k]) != 0)) k++;
    if (k == n) {
      fprintf(stderr, "mpi_tail: %s: unknown entry '%s'\n", flag, item);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    bits |= 1u << k;
  }
  free(copy);
  return bits;
}

/* chorus-bench's fill (bench/bench_ops.cc, fill_with): new values in the input every call, in a
   pattern of 4 written one by one and then copied in doubling runs up to 64 KiB, then 64 KiB at a
   time; a broadcast's receivers wipe theirs. */
static void write_input(int op, int rank, int call, float* x, long count) {
  if (op == kBroadcast && rank != 0) {
    memset(x, 0xff, (size_t)count * 4);
    return;
  }
  for (long k = 0; k < count && k < 4; k++) x[k] = (float)((k + rank + call) % 4);
  for (long done = 4, run; done < count; done += run) {
    run = done < 16384 ? done : 16384; /* 64 KiB of floats */
    if (run > count - done) run = count - done;
    memcpy(x + done, x, (size_t)run * 4);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int fresh = 0, last_rank = 0, tail = 0, step_matmul = 0, step_threads = 2;
  unsigned ops = ~0u, sizes = ~0u; /* bits of kNames and kSizes: all unless --ops / --sizes */
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--fresh") == 0)
      fresh = 1;
    else if (strcmp(argv[a], "--last-rank") == 0) /* each call's time is its slowest rank's */
      last_rank = 1;
    else if (strcmp(argv[a], "--tail") == 0) /* chorus-bench --tail: Note [A p95 beside busy cores] */
      tail = 1;
    else if (strcmp(argv[a], "--ops") == 0 && a + 1 < argc)
      ops = parse_list(argv[++a], "--ops", 0, 4);
    else if (strcmp(argv[a], "--sizes") == 0 && a + 1 < argc)
      sizes = parse_list(argv[++a], "--sizes", 1, 6);
    else if (strcmp(argv[a], "--step-matmul") == 0 && a + 1 < argc)
      step_matmul = atoi(argv[++a]);
    else if (strcmp(argv[a], "--step-threads") == 0 && a + 1 < argc)
      step_threads = atoi(argv[++a]);
    else {
      fprintf(stderr, "mpi_tail: unknown argument %s\n", argv[a]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
#ifdef CHORUS_STEP_LOAD
  if (step_matmul) chorus_step_load_init(step_threads, step_matmul);
#else
  if (step_matmul) {
    fprintf(stderr, "mpi_tail: --step-matmul needs -DCHORUS_STEP_LOAD and libchorus_step_load\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
#endif
  static double times[1000];
  if (rank == 0) printf("op bytes median_us p95_us mean_us\n");
  if (ops & (1u << kBarrier)) {
    for (int i = -10; i < 1000; i++) {
      double t = MPI_Wtime();
      MPI_Barrier(MPI_COMM_WORLD);
      if (i >= 0) times[i] = (MPI_Wtime() - t) * 1e6;
    }
    if (rank == 0) report("barrier", 0, times, 1000);
  }
  /* Op by op and size by size, each with buffers of its own, as chorus-bench runs them: a size's
     buffers shared by the three ops came warm to the second and third (chorus-bench's Note [Warm
     buffers]). */
  for (int op = kAllReduce; op <= kBroadcast; op++) {
    if (!(ops & (1u << op))) continue;
    for (int s = 0; s < 6; s++) {
      if (!(sizes & (1u << s))) continue;
      const long bytes = kSizes[s], count = bytes / 4 > 0 ? bytes / 4 : 1;
      float* x = calloc(count, 4); /* the input; a broadcast's buffer */
      float* y = op == kAllReduce ? calloc(count, 4) : op == kAllGather ? calloc(count * world, 4) : NULL;
      const int plain = bytes <= 65536 ? 200 : bytes <= (1 << 20) ? 50 : 10;
      const int iters = tail ? (bytes <= (1 << 20) ? 400 : 40) : plain;
      const int warmup = bytes <= (16 << 20) ? iters : 3;  // untimed: chorus-bench's Note [Warm buffers]
      for (int i = -warmup; i < iters; i++) {
        if (fresh) write_input(op, rank, i + warmup, x, count);
#ifdef CHORUS_STEP_LOAD
        if (step_matmul) chorus_step_load_run();
#endif
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        if (op == kAllReduce) MPI_Allreduce(x, y, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (op == kAllGather) MPI_Allgather(x, count, MPI_FLOAT, y, count, MPI_FLOAT, MPI_COMM_WORLD);
        if (op == kBroadcast) MPI_Bcast(x, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (i >= 0) times[i] = (MPI_Wtime() - t) * 1e6;
        MPI_Barrier(MPI_COMM_WORLD);
      }
      if (last_rank) MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rank == 0) report(kNames[op], bytes, times, iters);
      free(x);
      free(y);
    }
  }
  MPI_Finalize();
  return 0;
}
