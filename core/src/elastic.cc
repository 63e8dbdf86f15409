#include "chorus/core/elastic.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "chorus/core/error.h"
#include "chorus/core/tcp_store.h"

namespace chorus::elastic {

namespace {

// The round's store as chorusrun serves it (CHORUS_STORE_ADDR/PORT), without the per-attempt
// prefix connect_store() adds: the keys below are the launcher's.
Store& round_store() {
  static std::once_flag once;
  static std::shared_ptr<TcpStore> store;
  std::call_once(once, [] {
    const char* addr = std::getenv("CHORUS_STORE_ADDR");
    const char* port = std::getenv("CHORUS_STORE_PORT");
    if (!addr || !port)
      throw InvalidArgument("chorus::elastic: CHORUS_STORE_ADDR/PORT are not set (not under chorusrun)");
    store = std::make_shared<TcpStore>(addr, std::atoi(port));
  });
  return *store;
}

}  // namespace

bool launched() {
  const char* v = std::getenv("CHORUS_ELASTIC");
  return v && std::string(v) == "1";
}

int nodes_waiting(Communicator& comm) {
  if (!launched()) return 0;
  int64_t waiting = 0;
  if (comm.rank() == 0) {
    Store& store = round_store();
    static std::once_flag told;
    std::call_once(told, [&] { store.set("chorus/elastic/watching", "1"); });
    if (store.check({"chorus/elastic/nodes_waiting"})) waiting = std::stoll(store.get("chorus/elastic/nodes_waiting"));
  }
  comm.broadcast(&waiting, 1, DataType::Int64, 0);
  return int(waiting);
}

void request_new_round(Communicator& comm) {
  if (!launched()) return;
  if (comm.rank() == 0) round_store().set("chorus/elastic/reform", "1");
  comm.barrier();
}

}  // namespace chorus::elastic
