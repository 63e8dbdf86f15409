// The rendezvous store of a job, from what the launcher said (Environment).
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "chorus/core/environment.h"
#include "chorus/core/store.h"

namespace chorus {

// One process: an in-process HashStore. A launcher that hosts a store (chorusrun): a client of
// it. Otherwise (env://, mpirun, srun) rank 0 serves a TcpStore on MASTER_ADDR:MASTER_PORT and
// the others connect, retrying until `timeout` (default CHORUS_STORE_TIMEOUT_MS).
// Throws StoreError naming host:port when it cannot bind or connect, and InvalidArgument under
// torchrun's agent store, whose port chorus must not use.
std::shared_ptr<Store> connect_store(const Environment& env,
                                     std::optional<std::chrono::milliseconds> timeout = std::nullopt);

}  // namespace chorus
