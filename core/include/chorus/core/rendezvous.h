// The rendezvous store of a job, from what the launcher said (Environment).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "chorus/core/environment.h"
#include "chorus/core/store.h"

namespace chorus {

// One process: an in-process HashStore. A launcher that hosts a store (chorusrun): a client of
// it. Otherwise (env://, mpirun, srun) rank 0 serves a TcpStore on MASTER_ADDR:MASTER_PORT and
// the others connect, retrying until `timeout` (default CHORUS_STORE_TIMEOUT_MS). Under torchrun
// with its agent store (static rendezvous) every rank is a client of that store, in torch's
// protocol. A restarted job (restart_count > 0) meets under keys of its own.
// Throws StoreError naming host:port when it cannot bind or connect.
std::shared_ptr<Store> connect_store(const Environment& env,
                                     std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// The keys attempt `restart_count` of a restarted job meets under, in `store` (the store itself
// for the first attempt): what connect_store gives the ranks, for a launcher that writes to them.
std::shared_ptr<Store> attempt_store(std::shared_ptr<Store> store, int restart_count);

// A launcher's word to ranks still meeting on `store` that the job is over (a worker failed), or
// (chorusrun --nnodes) that their round is: ranks waiting in Communicator::create raise
// PeerFailure naming `failed_rank` (-1: none) and `why` within about a second instead of at their
// deadline.
void abort_rendezvous(Store& store, int failed_rank, const std::string& why);
// The launcher's word, if it said it: (failed rank, why).
std::optional<std::pair<int, std::string>> rendezvous_aborted(Store& store);

}  // namespace chorus
