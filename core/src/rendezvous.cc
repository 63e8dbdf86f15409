#include "chorus/core/rendezvous.h"

#include "chorus/core/error.h"
#include "chorus/core/hash_store.h"
#include "chorus/core/prefix_store.h"
#include "chorus/core/tcp_store.h"
#include "chorus/core/torch_store.h"

namespace chorus {

std::shared_ptr<Store> connect_store(const Environment& env, std::optional<std::chrono::milliseconds> timeout) {
  if (env.world_size == 1) return std::make_shared<HashStore>();
  if (env.master_port == 0)
    throw InvalidArgument(detail::concat("rank ", env.rank, " of ", env.world_size, " (", to_string(env.launcher),
                                         "): no rendezvous port; set MASTER_ADDR and MASTER_PORT"));
  std::shared_ptr<Store> store;
  if (env.master_port_taken_by_torchrun && !env.store_hosted) {
    // torchrun's agent serves MASTER_PORT in torch's protocol: meet there, under our own keys.
    store = std::make_shared<PrefixStore>("chorus/",
                                          std::make_shared<TorchStore>(env.master_addr, env.master_port, timeout));
  } else if (env.store_hosted || env.rank != 0) {
    store = std::make_shared<TcpStore>(env.master_addr, env.master_port, timeout);
  } else {
    store = TcpStore::serve(env.master_addr, env.master_port, timeout);
  }
  return attempt_store(std::move(store), env.restart_count);
}

std::shared_ptr<Store> attempt_store(std::shared_ptr<Store> store, int restart_count) {
  // A restarted job meets on the same store: each attempt under its own keys.
  if (restart_count == 0) return store;
  return std::make_shared<PrefixStore>(detail::concat("attempt/", restart_count, "/"), std::move(store));
}

namespace {
constexpr const char* kAbortKey = "chorus/abort";
}

void abort_rendezvous(Store& store, int failed_rank, const std::string& why) {
  store.set(kAbortKey, detail::concat(failed_rank, " ", why));
}

std::optional<std::pair<int, std::string>> rendezvous_aborted(Store& store) {
  if (!store.check({kAbortKey})) return std::nullopt;
  const std::string v = store.get(kAbortKey);
  const size_t space = v.find(' ');
  int rank = -1;
  try {
    rank = std::stoi(v.substr(0, space));
  } catch (const std::exception&) {
  }
  return std::make_pair(rank, space == std::string::npos ? v : v.substr(space + 1));
}

}  // namespace chorus
