// What a communication engine implements. The Communicator validates arguments, owns deadlines,
// the call order and the aborted state; a backend compares calls and moves and reduces bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "call.h"
#include "chorus/core/cross_options.h"
#include "chorus/core/shm_options.h"
#include "chorus/core/symmetric_memory.h"

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
  // No call follows: pays what this rank still owes its last call (Note [Owed waits]), waiting
  // until `deadline` at most, and throws what run() would have thrown for it. Nothing by default.
  virtual void finish(Clock::time_point /*deadline*/) {}
  // Runs an AllocSymmetric call (count = bytes): Note [Symmetric memory]. This default checks the
  // call with the other ranks and returns ordinary memory; a backend that can share buffers
  // between the ranks overrides it.
  virtual SymmetricMemory alloc_symmetric(const Call& call);
};

struct BackendOptions {
  std::string group_name;
  // How messages name each rank of the group: "rank 2 (global rank 5 on host2)"
  // (Communicator::describe_rank). Empty: "rank 2".
  std::vector<std::string> rank_names;
  std::string name_rank(int rank) const {
    return rank >= 0 && size_t(rank) < rank_names.size() ? rank_names[size_t(rank)] : "rank " + std::to_string(rank);
  }
  ShmOptions shm;              // settled: CommunicatorOptions::shm or the settings
  CrossOptions cross;          // settled: CommunicatorOptions::cross or the settings
  Clock::time_point deadline;  // for the rendezvous
};

// Ordinary, zero-filled, 64-byte aligned memory behind a SymmetricMemory handle.
SymmetricMemory private_memory(size_t bytes);

// Note [Backend table]: the backends this build has, one row each, in the order "auto" tries
// them: the first that can serve the group wins (NCCL's rule for transports). shm serves ranks
// that are all on this host; tcp (chorus's own, always built), gloo and mpi serve any group. The
// gloo and mpi rows exist only when their library was found at build time (CHORUS_HAVE_GLOO,
// CHORUS_HAVE_MPI).
struct BackendRow {
  const char* name;
  bool crosses_hosts;  // can serve ranks on several hosts
  std::unique_ptr<Backend> (*make)(Store& store, int rank, int size, const BackendOptions& options);
};
const std::vector<BackendRow>& backend_table();
// Backend names this build accepts: "auto", then the table's rows.
std::vector<std::string> available_backends();
// Throws InvalidArgument naming `group` and the accepted names unless `name` is one of them.
void check_backend_name(const std::string& name, const std::string& group);
// The row that serves a group asked for backend `name` ("auto" or a row's name); `elsewhere`
// lists the ranks on other hosts ("" when all are on this host). Throws InvalidArgument when the
// named backend cannot serve the group, or "auto" finds no row that can.
const BackendRow& choose_backend(const std::string& name, const std::string& elsewhere, const std::string& group);

// The shared-memory engine; every rank must be on this host. Collective over `size` ranks.
std::unique_ptr<Backend> make_shm_backend(Store& store, int rank, int size, const BackendOptions& options);

}  // namespace chorus
