#include "chorus/core/rendezvous.h"

#include "chorus/core/error.h"
#include "chorus/core/hash_store.h"
#include "chorus/core/tcp_store.h"

namespace chorus {

std::shared_ptr<Store> connect_store(const Environment& env, std::optional<std::chrono::milliseconds> timeout) {
  if (env.world_size == 1) return std::make_shared<HashStore>();
  if (env.master_port_taken_by_torchrun && !env.store_hosted)
    throw InvalidArgument(detail::concat(
        "torchrun's agent store holds MASTER_PORT ", env.master_port,
        " and speaks torch's protocol, which chorus does not: start this program with chorusrun or mpirun"));
  if (env.master_port == 0)
    throw InvalidArgument(detail::concat("rank ", env.rank, " of ", env.world_size, " (", to_string(env.launcher),
                                         "): no rendezvous port; set MASTER_ADDR and MASTER_PORT"));
  if (env.store_hosted || env.rank != 0) return std::make_shared<TcpStore>(env.master_addr, env.master_port, timeout);
  return TcpStore::serve(env.master_addr, env.master_port, timeout);
}

}  // namespace chorus
