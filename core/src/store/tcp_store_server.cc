// The TcpStore server: one thread, poll() over every connection, buffered parsing.
// A request that cannot be answered yet (get or wait on a missing key) parks as a Waiter and is
// answered when a later set/add/compare_set supplies the keys, or with Timeout at its deadline.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <list>
#include <map>
#include <random>

#include "chorus/core/digest.h"
#include "chorus/core/error.h"
#include "chorus/core/settings.h"
#include "chorus/core/tcp_store.h"
#include "store/socket_util.h"
#include "store/tcp_wire.h"

namespace chorus {

using Clock = std::chrono::steady_clock;
using wire::Command;
using wire::Status;

struct TcpStoreServer::Loop {
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  struct Conn {
    std::string in, out;
    std::string challenge;  // what Hello sent; the Auth must answer it
    bool proven = false;    // answered: may use the store
  };
  std::string secret;  // empty: anyone may use the store
  std::map<int, Conn> conns;
  struct Waiter {
    int fd;
    uint32_t id;
    Command cmd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  std::list<Waiter> waiters;
  KeyValueTable table;

  void reply(int fd, uint32_t id, Status status, const std::string& payload = {}) {
    wire::Writer w;
    w.u32(id).u8(uint8_t(status)).raw(payload);
    conns[fd].out += w.finish();
  }

  static std::string str_payload(const std::string& s) { return wire::Writer::field_str(s); }

  void answer_waiter(const Waiter& w) {
    reply(w.fd, w.id, Status::Ok, w.cmd == Command::Get ? str_payload(*table.find(w.keys[0])) : std::string());
  }

  void wake_waiters() {
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (table.contains_all(it->keys)) {
        answer_waiter(*it);
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }

  void handle(int fd, std::string_view body) {
    wire::Reader r(body);
    uint32_t id = r.u32();
    uint8_t cmd_byte = r.u8();
    if (cmd_byte < uint8_t(Command::Set) || cmd_byte > uint8_t(Command::kLast))
      throw wire::MalformedFrame("unknown command " + std::to_string(cmd_byte));
    Command cmd = Command(cmd_byte);
    if (cmd == Command::Hello || cmd == Command::Auth) return authenticate(fd, id, cmd, r);
    if (!secret.empty() && !conns[fd].proven) {
      reply(fd, id, Status::Error,
            str_payload("this store belongs to a job with a secret, and the client did not prove it knows it "
                        "(give every process of the job the same CHORUS_RDZV_SECRET)"));
      return;
    }
    switch (cmd) {
      case Command::Hello:
      case Command::Auth: return;
      case Command::Set: {
        std::string key = r.str(), value = r.str();
        expect_end(r);
        table.set(key, std::move(value));
        reply(fd, id, Status::Ok);
        wake_waiters();
        return;
      }
      case Command::Get:
      case Command::Wait: {
        std::vector<std::string> keys;
        if (cmd == Command::Get) {
          keys.push_back(r.str());
        } else {
          uint32_t n = r.u32();
          if (n > body.size()) throw wire::MalformedFrame("key count exceeds the frame");
          for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
        }
        int64_t timeout_ms = r.i64();
        expect_end(r);
        Waiter w{fd, id, cmd, std::move(keys),
                 Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))};
        if (table.contains_all(w.keys))
          answer_waiter(w);
        else
          waiters.push_back(std::move(w));
        return;
      }
      case Command::Add: {
        std::string key = r.str();
        int64_t delta = r.i64();
        expect_end(r);
        try {
          int64_t v = table.add(key, delta);
          reply(fd, id, Status::Ok, wire::Writer::field_i64(v));
        } catch (const StoreError& e) {
          reply(fd, id, Status::Error, str_payload(e.what()));
        }
        wake_waiters();
        return;
      }
      case Command::CompareSet: {
        std::string key = r.str(), expected = r.str(), desired = r.str();
        expect_end(r);
        reply(fd, id, Status::Ok, str_payload(table.compare_set(key, expected, desired)));
        wake_waiters();
        return;
      }
      case Command::Check: {
        uint32_t n = r.u32();
        if (n > body.size()) throw wire::MalformedFrame("key count exceeds the frame");
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
        expect_end(r);
        reply(fd, id, Status::Ok, std::string(1, char(table.contains_all(keys))));
        return;
      }
      case Command::Delete: {
        std::string key = r.str();
        expect_end(r);
        reply(fd, id, Status::Ok, std::string(1, char(table.erase(key))));
        return;
      }
    }
  }

  // Note [The job's secret]: a client proves it knows the secret by answering a fresh random
  // challenge with HMAC-SHA-256(secret, challenge), so the secret never crosses the network and
  // an answer seen once does not open another connection. Without a secret, Hello answers an
  // empty challenge and every command is allowed. This keeps stray processes and other jobs out
  // (they can neither read, write nor abort a rendezvous); it is no defence against someone who
  // can read and rewrite the traffic of a connection already opened.
  void authenticate(int fd, uint32_t id, Command cmd, wire::Reader& r) {
    Conn& c = conns[fd];
    if (cmd == Command::Hello) {
      expect_end(r);
      if (!secret.empty()) {
        static thread_local std::mt19937_64 random{std::random_device{}()};
        c.challenge = detail::concat(std::hex, random(), random());
      }
      reply(fd, id, Status::Ok, str_payload(c.challenge));
      return;
    }
    const std::string proof = r.str();
    expect_end(r);
    if (secret.empty() || (!c.challenge.empty() && proof == hmac_sha256_hex(secret, c.challenge))) {
      c.proven = true;
      reply(fd, id, Status::Ok);
    } else {
      reply(fd, id, Status::Error,
            str_payload("the client's CHORUS_RDZV_SECRET differs from this job's: give every process of the job "
                        "the same secret"));
    }
    c.challenge.clear();  // one answer per challenge
  }

  static void expect_end(const wire::Reader& r) {
    if (!r.done()) throw wire::MalformedFrame("trailing bytes after the request");
  }

  void drop(int fd) {
    close(fd);
    conns.erase(fd);
    waiters.remove_if([fd](const Waiter& w) { return w.fd == fd; });
  }

  // Parses every whole frame in the connection's buffer. False: the connection must go.
  bool on_readable(int fd) {
    Conn& c = conns[fd];
    char buf[64 * 1024];
    while (true) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, size_t(n));
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    try {
      size_t body = 0, used = 0;
      while (size_t whole = wire::complete_frame(std::string_view(c.in).substr(used), &body)) {
        handle(fd, std::string_view(c.in).substr(used + 4, body));
        used += whole;
      }
      conns[fd].in.erase(0, used);
    } catch (const wire::MalformedFrame& e) {
      if (settings().log_level >= 1) std::fprintf(stderr, "[chorus] TcpStore: dropping a client: %s\n", e.what());
      return false;
    }
    return true;
  }

  bool on_writable(int fd) {
    Conn& c = conns[fd];
    while (!c.out.empty()) {
      ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, size_t(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    return true;
  }

  void expire_waiters() {
    auto now = Clock::now();
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline <= now) {
        reply(it->fd, it->id, Status::Timeout);
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }

  int poll_timeout_ms() const {
    if (waiters.empty()) return -1;
    auto next = std::min_element(waiters.begin(), waiters.end(), [](const Waiter& a, const Waiter& b) {
                  return a.deadline < b.deadline;
                })->deadline;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    return int(std::clamp<long long>(ms, 0, 60000));
  }

  void run() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_pipe[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : conns) fds.push_back({fd, short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      int rc = poll(fds.data(), fds.size(), poll_timeout_ms());
      if (rc < 0 && errno != EINTR) return;
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        while (true) {
          int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          conns[fd];
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        int fd = fds[i].fd;
        bool keep = true;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) keep = on_readable(fd);
        if (keep && !conns[fd].out.empty()) keep = on_writable(fd);
        if (!keep) drop(fd);
      }
      expire_waiters();
      for (auto& [fd, c] : conns)
        if (!c.out.empty()) on_writable(fd);
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret)
    : host_(host), loop_(std::make_unique<Loop>()) {
  loop_->secret = std::move(secret);
  loop_->listen_fd = net::listen_on(host, port, &port_);
  net::set_nonblocking(loop_->listen_fd);
  if (pipe2(loop_->wake_pipe, O_CLOEXEC) != 0) {
    close(loop_->listen_fd);
    throw StoreError("TcpStore server: cannot create its wake-up pipe");
  }
  thread_ = std::thread([this] { loop_->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  (void)!write(loop_->wake_pipe[1], &c, 1);
  thread_.join();
  for (auto& [fd, conn] : loop_->conns) close(fd);
  close(loop_->listen_fd);
  close(loop_->wake_pipe[0]);
  close(loop_->wake_pipe[1]);
}

}  // namespace chorus
