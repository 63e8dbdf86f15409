// What a communication engine implements. The Communicator validates arguments, owns deadlines,
// the async executor and the aborted state; a backend only moves and reduces bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "call.h"
#include "chorus/core/communicator.h"

namespace chorus {

class Store;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Runs one call on the calling thread. Blocks until this rank's part is done. Collectives come
  // one at a time; sends and receives may come concurrently with them and with each other, but
  // never two on the same (peer, direction). Throws
  // InvalidArgument (call.invalid, or another rank's), TimeoutError, PeerFailure or
  // CollectiveMismatch; after the last three the backend stays unusable.
  virtual void run(const Call& call) = 0;
  // Marks this rank as gone for its peers, so they fail fast instead of waiting.
  virtual void abort(const std::exception_ptr& cause) = 0;
  // Runs an AllocSymmetric call (count = bytes): Note [Symmetric memory]. This default checks the
  // call with the other ranks and returns ordinary memory; a backend that can share buffers
  // between the ranks overrides it.
  virtual SymmetricMemory alloc_symmetric(const Call& call);
};

// Ordinary, zero-filled, 64-byte aligned memory behind a SymmetricMemory handle.
SymmetricMemory private_memory(size_t bytes);

struct BackendOptions {
  std::string group_name;
  size_t shm_chunk_bytes = 0;
  Clock::time_point deadline;  // for the rendezvous
};

// Backend names this build accepts: auto, shm, and gloo / mpi when built with their libraries.
std::vector<std::string> available_backends();

// The shared-memory engine; every rank must be on this host. Collective over `size` ranks.
std::unique_ptr<Backend> make_shm_backend(Store& store, int rank, int size, const BackendOptions& options);

}  // namespace chorus
