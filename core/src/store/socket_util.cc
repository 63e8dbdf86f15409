#include "store/socket_util.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "chorus/core/error.h"

namespace chorus::net {
namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

void resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
  if (rc != 0)
    throw StoreError(detail::concat("cannot resolve store address ", host, ":", port, ": ", gai_strerror(rc)));
}

}  // namespace

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int listen_on(const std::string& host, int port, int* bound_port) {
  AddrInfo ai;
  resolve(host, port, true, &ai);
  int last_errno = 0;
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      *bound_port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
      return fd;
    }
    last_errno = errno;
    close(fd);
  }
  throw StoreError(detail::concat("cannot listen on ", host, ":", port, ": ", std::strerror(last_errno)));
}

int connect_to(const std::string& host, int port, std::chrono::milliseconds timeout, bool refused_is_final) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto backoff = std::chrono::milliseconds(5);
  std::string last_error = "timed out";
  bool given_up = false;  // refused, and refusals are final
  while (true) {
    AddrInfo ai;
    resolve(host, port, false, &ai);
    for (addrinfo* a = ai.list; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) continue;
      // Non-blocking, so that a host that drops the SYN (cut off) costs the timeout, not the
      // kernel's two minutes of retries.
      int rc = connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{fd, POLLOUT, 0};
        int err = ETIMEDOUT;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, int(std::max<long long>(1, left.count()))) == 1)
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
      }
      const bool refused = errno == ECONNREFUSED;
      last_error = std::strerror(errno);
      close(fd);
      if (refused && refused_is_final) {
        given_up = true;
        break;
      }
    }
    if (given_up || std::chrono::steady_clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  throw StoreError(detail::concat("could not connect to the TcpStore at ", host, ":", port, " within ", waited.count(),
                                  " ms: ", last_error,
                                  " (is the server running, and are MASTER_ADDR/MASTER_PORT right?)"));
}

int free_port(const std::string& host) {
  try {
    int port = 0;
    close(listen_on(host, 0, &port));
    return port;
  } catch (const StoreError&) {
    return 0;
  }
}

std::string local_address_toward(const std::string& host, int port) {
  AddrInfo ai;
  resolve(host, port, false, &ai);
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok =
        connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (!ok) continue;
    char name[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&local), len, name, sizeof(name), nullptr, 0, NI_NUMERICHOST) == 0)
      return name;
  }
  throw StoreError(detail::concat("no local address reaches ", host, ":", port));
}

bool send_all(int fd, const char* data, size_t size, std::chrono::steady_clock::time_point deadline) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, int(left.count()));
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace chorus::net
