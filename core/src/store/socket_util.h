// Thin wrappers over BSD sockets: the only place errno is turned into messages for the stores.
#pragma once

#include <chrono>
#include <string>

namespace chorus::net {

// Listening TCP socket on host:port (port 0: any). Returns the fd and sets *bound_port.
// Throws StoreError naming host:port.
int listen_on(const std::string& host, int port, int* bound_port);

// Connects to host:port, retrying refused/unreachable attempts until `timeout` passes (the server
// may not have started yet); with `refused_is_final`, a refusal ends it at once (a server that
// answered before and now refuses is gone). Throws StoreError naming host:port and the last error.
int connect_to(const std::string& host, int port, std::chrono::milliseconds timeout, bool refused_is_final = false);

void set_nonblocking(int fd);

// A port nobody listens on now at host (0 when none can be had).
int free_port(const std::string& host);
// The address of this host that packets to host:port leave from. Throws StoreError.
std::string local_address_toward(const std::string& host, int port);

// Writes all of data before the deadline; false on error or timeout.
bool send_all(int fd, const char* data, size_t size, std::chrono::steady_clock::time_point deadline);

}  // namespace chorus::net
