// A training step's compute between collective calls, for bench/compare.py --load matmul: a float
// matmul on the intra-op threads torch.set_num_threads(threads) gives it. The same code runs in
// chorus-bench and in Open MPI's bench/mpi_tail.c, which is C and calls it through these two
// functions. After the matmul the intra-op pool's idle threads keep polling for a while (OpenMP's
// wait policy), as they do in a real step: that, and the matmul's own threads, are what take the
// cores a collective's waits need.
#include <torch/torch.h>

namespace {
torch::Tensor a, b, c;
}  // namespace

extern "C" {

// An n x n matmul on `threads` intra-op threads per step.
void chorus_step_load_init(int threads, int n) {
  torch::set_num_threads(threads);
  a = torch::rand({n, n});
  b = torch::rand({n, n});
  c = torch::empty({n, n});
}

void chorus_step_load_run(void) { torch::mm_out(c, a, b); }

}  // extern "C"
