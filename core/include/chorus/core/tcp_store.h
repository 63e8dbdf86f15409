// A Store served over TCP: one server (in the launcher or rank 0), clients everywhere.
#pragma once

#include <atomic>
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
  // address when it cannot bind. With a secret, only clients that prove they know it may use
  // the store (Note [The job's secret]).
  TcpStoreServer(const std::string& host, int port, std::string secret = {});
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

// A client. Thread-safe: each request borrows a connection from a small pool (opening another
// when all are busy), so a thread blocked in get() or wait() never holds up the others.
class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (default CHORUS_STORE_TIMEOUT_MS, 5 minutes);
  // then throws StoreError naming host:port. The timeout also bounds every later request. Every
  // connection proves it knows `secret` (default: CHORUS_RDZV_SECRET, if set) to a server that
  // has one; a server with another secret makes it throw StoreError saying so.
  TcpStore(std::string host, int port, std::optional<std::chrono::milliseconds> timeout = std::nullopt,
           std::optional<std::string> secret = std::nullopt);
  ~TcpStore() override;

  // Starts a server on host:port (0: any free port) and returns a client of it that keeps the
  // server alive. port() tells the real port.
  static std::shared_ptr<TcpStore> serve(const std::string& host, int port,
                                         std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                                         std::optional<std::string> secret = std::nullopt);

  CHORUS_STORE_OPERATIONS;
  std::string describe() const override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  // Sends one request (built by `build` for a request id) on a pooled connection and returns
  // the response after the status byte. Throws StoreError, whose text contains "timed out" when
  // the server reported a timeout.
  template <class Build>
  std::string call(Build&& build, const std::string& what, std::chrono::milliseconds limit);
  // A new connection to the server, authenticated when there is a secret.
  int open_connection(std::chrono::milliseconds timeout, bool refused_is_final = false);
  std::string exchange(int fd, const std::string& frame, uint32_t id, const std::string& what,
                       std::chrono::milliseconds limit);

  std::string host_;
  int port_;
  std::string secret_;
  std::atomic<bool> gone_{false};  // a reconnection failed: the server went away for good
  std::mutex mu_;
  std::vector<int> idle_;  // pooled connections not in use
  uint32_t last_id_ = 0;
  std::unique_ptr<TcpStoreServer> server_;  // set when this client was made by serve()
};

// A TCP port nobody listens on now at host (0 when none can be had); someone may take it
// before the caller does.
int free_port(const std::string& host);

}  // namespace chorus
