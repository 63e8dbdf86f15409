/* Open MPI's collectives on one machine, as a program written against MPI would call them: the
   barrier (1000 calls), then all_reduce, all_gather and broadcast of f32 from 8 B to 64 MiB per
   rank, each call between two barriers, the buffers written once. (bench/mpi_tail.c --fresh writes
   each input before every call, as chorus-bench does; bench/compare.py runs both.)
   Build: mpicc -O2 mpi_collectives.c -o mpi_collectives
   Run:   mpirun --allow-run-as-root --oversubscribe -np N mpi_collectives
   Prints on rank 0: op bytes median_us algbw_GBps busbw_GBps (nccl-tests' conventions). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { kMaxIters = 1000 };

static int ascending(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* t, int n) {
  qsort(t, (size_t)n, sizeof(double), ascending);
  return t[n / 2];
}

typedef enum { kAllReduce, kAllGather, kBroadcast } Op;

/* The median time of `iters` calls of `op` on `count` floats, each between barriers, after `warmup` untimed. */
static double time_op(Op op, float* in, float* out, int count, int iters, int warmup) {
  static double t[kMaxIters];
  for (int i = -warmup; i < iters; ++i) {  // untimed first
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (op == kAllReduce) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (op == kAllGather) MPI_Allgather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, MPI_COMM_WORLD);
    if (op == kBroadcast) MPI_Bcast(in, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (i >= 0) t[i] = MPI_Wtime() - start;
  }
  return median(t, iters);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  static double t[kMaxIters];
  for (int i = 0; i < 10; ++i) MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < kMaxIters; ++i) {
    const double start = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    t[i] = MPI_Wtime() - start;
  }
  if (rank == 0) printf("%-11s %10d %12.2f\n", "barrier", 0, median(t, kMaxIters) * 1e6);
  const long sizes[] = {8, 1024, 65536, 1L << 20, 16L << 20, 64L << 20};
  for (int s = 0; s < 6; ++s) {
    const long bytes = sizes[s];
    const int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
    float* in = malloc((size_t)count * 4);
    float* out = malloc((size_t)count * 4 * (size_t)n);
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < count; ++i) in[i] = 1.0f;
    const int iters = bytes <= 65536 ? 200 : bytes <= (1L << 20) ? 50 : 10;
    const int warmup = bytes <= (16L << 20) ? iters : 3;  // as chorus-bench's (Note [Warm buffers])
    const double ar = time_op(kAllReduce, in, out, count, iters, warmup);
    const double ag = time_op(kAllGather, in, out, count, iters, warmup);
    const double bc = time_op(kBroadcast, in, out, count, iters, warmup);
    if (rank == 0) {
      printf("%-11s %10ld %12.2f %8.3f %8.3f\n", "all_reduce", bytes, ar * 1e6, bytes / ar / 1e9,
             bytes / ar / 1e9 * 2 * (n - 1) / n);
      printf("%-11s %10ld %12.2f %8.3f %8.3f\n", "all_gather", bytes, ag * 1e6, (double)bytes * n / ag / 1e9,
             (double)bytes * n / ag / 1e9 * (n - 1) / n);
      printf("%-11s %10ld %12.2f %8.3f %8.3f\n", "broadcast", bytes, bc * 1e6, bytes / bc / 1e9, bytes / bc / 1e9);
    }
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
