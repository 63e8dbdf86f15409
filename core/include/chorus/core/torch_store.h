// A client of torch's own TCPStore (c10d's wire protocol, as torch 2.x speaks it): what lets
// chorus meet its peers on the store that torchrun's agent hosts at MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True), instead of colliding with it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/core/store.h"

namespace chorus {

class TorchStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (default CHORUS_STORE_TIMEOUT_MS); then
  // throws StoreError naming host:port. Thread-safe: requests borrow pooled connections.
  TorchStore(std::string host, int port, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  ~TorchStore() override;

  // compare_set has torch's semantics: an absent key with a non-empty `expected` is left absent
  // and `expected` is returned.
  CHORUS_STORE_OPERATIONS;
  std::string describe() const override;

 private:
  class Connection;
  // One request and its answer on a borrowed connection: a fixed-size value, or (std::string) a
  // length-prefixed byte string. Throws StoreError naming `what` when the connection fails or
  // no answer comes within timeout().
  template <class Answer>
  Answer ask(const std::string& request, const std::string& what);
  std::unique_ptr<Connection> borrow();
  void give_back(std::unique_ptr<Connection> c);

  std::string host_;
  int port_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace chorus
