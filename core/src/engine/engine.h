// Backends that run on an existing communication engine (Gloo, MPI) instead of chorus's own
// shared memory. An Engine moves bytes; EngineBackend turns it into a chorus Backend with the
// same contract as shm: calls are checked against the other ranks' first (Note [Comparing calls]),
// every dtype and op works (f16/bf16 reduce in f32, mean divides once at the end), timeouts name
// the missing ranks, and a rank that dies or gives up is reported to the others within seconds
// (Note [Engine failures]).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"

namespace chorus {

// Thrown by an Engine when its call failed (an I/O error, a closed connection, its timeout).
struct EngineFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// out[i] = a[i] op b[i] for n elements; out may equal a or b.
using Fold = std::function<void(void* out, const void* a, const void* b, size_t n)>;
using Millis = std::chrono::milliseconds;

// What a reduction computes, for engines that call back into chorus's kernels (Gloo takes the
// fold) and for those that need a plain function per type and op (MPI).
struct Reduction {
  DataType dtype;  // never f16/bf16: EngineBackend reduces those in f32
  ReduceOp op;     // never Mean: it arrives as Sum and EngineBackend divides afterwards
  Fold fold;       // the same reduction as a function
  size_t elem() const { return element_size(dtype); }
};

// One group's byte-moving primitives. Collectives are called one at a time, in the same order on
// every rank; send and recv may run concurrently with them and each other (never two on the same
// peer and direction). Buffers never alias unless a method says so. Each call gets the time left
// before its deadline and throws EngineFailure when the engine reports an error.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  virtual void barrier(Millis left) = 0;
  // in == out allowed.
  virtual void all_reduce(const void* in, void* out, size_t count, const Reduction& r, Millis left) = 0;
  // out only on root; in == out allowed.
  virtual void reduce(const void* in, void* out, size_t count, const Reduction& r, int root, Millis left) = 0;
  // in: size() blocks of `count` elements; out: this rank's block of the reduction.
  virtual void reduce_scatter(const void* in, void* out, size_t count, const Reduction& r, Millis left) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root, Millis left) = 0;
  virtual void all_gather(const void* in, void* out, size_t bytes, Millis left) = 0;
  // Rank p's block into outs[p] (in may be one of them). By default through one staging buffer.
  virtual void all_gather_to(const void* in, const std::vector<void*>& outs, size_t bytes, Millis left) {
    std::vector<uint8_t> all(outs.size() * bytes);
    all_gather(in, all.data(), bytes, left);
    for (size_t p = 0; p < outs.size(); ++p) std::memcpy(outs[p], all.data() + p * bytes, bytes);
  }
  virtual void all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes, Millis left) = 0;
  // out only on root.
  virtual void gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root, Millis left) = 0;
  // in only on root: size() blocks of `bytes`.
  virtual void scatter(const void* in, void* out, size_t bytes, int root, Millis left) = 0;
  virtual void all_to_all_v(const void* in, const std::vector<size_t>& send_bytes, void* out,
                            const std::vector<size_t>& recv_bytes, Millis left) = 0;
  // Point to point on two channels: `ack` carries replies, so that they never mix with data
  // flowing the same way.
  virtual void send(const void* buf, size_t bytes, int dst, bool ack, Millis left) = 0;
  virtual void recv(void* buf, size_t bytes, int src, bool ack, Millis left) = 0;
  // recv on the data channel from whichever rank's message comes first; returns that rank.
  virtual int recv_any(void* buf, size_t bytes, Millis left) = 0;
  // From another thread: make calls in progress fail soon (with EngineFailure), because the
  // group is being aborted. Best effort: where the engine cannot, they fail at their timeout.
  virtual void interrupt() = 0;
  // Whether interrupt() works; reported in messages when it does not.
  virtual bool can_interrupt() const = 0;
};

// The Backend over `engine`, whose group is `size` ranks that share `store` (a store of this
// group only: the backend keeps its failure records and heartbeats there).
std::unique_ptr<Backend> make_engine_backend(std::unique_ptr<Engine> engine, Store& store, int rank, int size,
                                             const BackendOptions& options);

// chorus's own TCP (Note [chorus's own TCP]): a full mesh connected through `store`, with the
// algorithms of Note [Algorithms between hosts] chosen by `cross` and the cost model.
std::unique_ptr<Engine> make_tcp_engine(Store& store, int rank, int size, const CrossOptions& cross, Millis left);

// The next two exist only when their library was found at build time (backend_table.cc calls them
// under CHORUS_HAVE_GLOO and CHORUS_HAVE_MPI). Declared either way, so that a file that includes
// this one compiles the same with MPI and without, and scripts/test.sh's compiler cache serves the
// Python package's build (CHORUS_MPI=OFF) from the main one.

// Gloo over TCP: a full mesh connected through `store`. Listens on the address that routes to
// MASTER_ADDR (127.0.0.1 without it), or on the interface GLOO_SOCKET_IFNAME names.
std::unique_ptr<Engine> make_gloo_engine(Store& store, int rank, int size, Millis left);

// MPI: the group's ranks, found in MPI_COMM_WORLD through `store`, as an MPI communicator of
// their own (MPI_Comm_create_group, collective over the members only). Initializes MPI with
// MPI_THREAD_MULTIPLE when the program has not, and finalizes it at exit; MPI_Init is collective
// over the whole mpirun job, so every process must create its first mpi group at the same time
// (the world group, as usual). MPI_Comm_create_group has no deadline; it runs once the group's
// rendezvous has seen every member.
std::unique_ptr<Engine> make_mpi_engine(Store& store, int rank, int size, const std::string& group, Millis left);

}  // namespace chorus
