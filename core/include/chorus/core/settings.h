// Every CHORUS_* setting, read from the process environment in one place (settings.cc).
//
//   CHORUS_TIMEOUT_MS          default deadline of every blocking call (overrides the group's)
//   CHORUS_STORE_TIMEOUT_MS    default deadline of TcpStore connects and requests (default 300000)
//   CHORUS_BACKEND             backend when the caller says "auto": auto | shm | tcp | gloo
//   CHORUS_CROSS_ALGORITHM     the tcp backend's algorithm between hosts, for every collective
//                              ("ring") or per collective ("all_reduce=ring,broadcast=binomial");
//                              unset: chosen by the cost model (cross_options.h)
//   CHORUS_CROSS_COST          the cost model's network terms ("alpha_us=30,gbps=10,fold_gbps=40,
//                              o_us=2"); unset: measured when each group is made
//   CHORUS_SHM_CHUNK_BYTES     size of each rank's shared-memory slot (default 524288; rank 0's
//                              value holds for the whole group; with more ranks than
//                              cores a slot holds up to 4 of them); small
//                              values force the multi-chunk paths
//   CHORUS_SHM_SPIN_US         microseconds a shared-memory wait spins before it yields
//                              (default 50); never while the awaited rank last ran on the
//                              waiter's CPU, and when ranks outnumber cores only where no
//                              rank of the waiter's group last ran on its CPU
//   CHORUS_SHM_SINGLE_COPY     1: a middle-sized all_gather on shared memory, with a core for
//                              every rank, writes into its peers' outputs directly
//                              (process_vm_writev) where the kernel allows it; 0: never;
//                              unset: where rank 0 timed that faster than the slots, lately,
//                              on calls of that size
//   CHORUS_SHM_STAGE_BYTES     shared memory a group may stage a broadcast larger than its
//                              slots in, so that the root need not wait for its readers
//                              (default 67108864; 0: none; rank 0's value holds), reserved by
//                              the group's first such broadcast while /dev/shm has room
//   CHORUS_RECV_CACHE_MB       memory the torch layer keeps for reuse by large received tensors
//                              once they are freed (default 512; 0: off). Fresh pages cost a
//                              page fault each, which dominates receiving large objects.
//   CHORUS_LOG_LEVEL           0 quiet (default); 1: the backend each group runs on and dropped
//                              store clients, on stderr
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "chorus/core/cross_options.h"
#include "chorus/core/shm_options.h"

namespace chorus {

using EnvMap = std::map<std::string, std::string>;

// A snapshot of this process's environment variables.
EnvMap current_environment();

struct Settings {
  std::optional<std::chrono::milliseconds> timeout;
  std::chrono::milliseconds store_timeout{std::chrono::minutes(5)};
  std::string backend = "auto";
  // CHORUS_SHM_CHUNK_BYTES, CHORUS_SHM_SINGLE_COPY (nullopt: where measured faster, Note
  // [Single-copy collectives]), CHORUS_SHM_STREAM_SLOTS (nullopt: measured as the job runs, Note
  // [Streaming into the slots]), CHORUS_SHM_STAGE_BYTES.
  ShmOptions shm{.chunk_bytes = 512 * 1024, .stage_bytes = size_t(64) << 20};
  std::optional<int> shm_spin_us;
  // CHORUS_CROSS_ALGORITHM, CHORUS_CROSS_COST (Note [Choosing an algorithm between hosts]).
  CrossOptions cross;
  int log_level = 0;
  size_t recv_cache_bytes = size_t(512) << 20;
};

// Parses the CHORUS_* entries of `env`. Throws InvalidArgument naming a malformed variable.
Settings read_settings(const EnvMap& env);

// The process's settings, read once on first use. Thread-safe.
const Settings& settings();

// Integer environment variable or nullopt; throws InvalidArgument naming it when malformed.
std::optional<long long> env_int(const EnvMap& env, const std::string& name);

}  // namespace chorus
