// A Store served over TCP: one server (in the launcher or rank 0), clients everywhere.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "chorus/core/store.h"

namespace chorus {

// Serves a KeyValueTable to any number of TcpStore clients from one event-loop thread.
// Malformed or truncated frames close only the connection that sent them.
class TcpStoreServer {
 public:
  // Binds host:port (port 0: the kernel picks one; see port()). Throws StoreError naming the
  // address when it cannot bind.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();  // stops serving; clients then see their connection close
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  struct Loop;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// A client. Thread-safe: requests from several threads are serialized on one connection.
class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout`; then throws StoreError naming host:port.
  TcpStore(std::string host, int port, std::chrono::milliseconds timeout = std::chrono::minutes(5));
  ~TcpStore() override;

  // Starts a server on host:port (0: any free port) and returns a client of it that keeps the
  // server alive. port() tells the real port.
  static std::shared_ptr<TcpStore> serve(const std::string& host, int port,
                                         std::chrono::milliseconds timeout = std::chrono::minutes(5));

  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string describe() const override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  // Sends one request and returns the response body after the status byte; throws StoreError
  // (or a timeout StoreError listing `what`) on failure.
  std::string call(const std::string& frame, uint32_t id, const std::string& what,
                   std::chrono::milliseconds limit);
  uint32_t next_id() { return ++last_id_; }

  std::string host_;
  int port_;
  int fd_ = -1;
  std::mutex mu_;
  uint32_t last_id_ = 0;
  std::unique_ptr<TcpStoreServer> server_;  // set when this client was made by serve()
};

}  // namespace chorus
