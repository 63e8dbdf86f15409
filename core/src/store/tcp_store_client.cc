#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "chorus/core/digest.h"
#include "chorus/core/error.h"
#include "chorus/core/settings.h"
#include "chorus/core/tcp_store.h"
#include "store/socket_util.h"
#include "store/store_util.h"
#include "store/tcp_wire.h"

namespace chorus {

using Clock = std::chrono::steady_clock;
using wire::Command;
using wire::Status;

namespace {
// Blocking calls on the server carry their own timeout; the client allows this much more for
// the answer to travel back before it gives up on the server. Never more than the client's own
// timeout: a client that expects answers within 300 ms (an elastic agent asking another) must not
// sit 5 s on a server whose link went down.
constexpr auto kReplyGrace = std::chrono::milliseconds(5000);
std::chrono::milliseconds reply_grace(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(
      kReplyGrace, std::max<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(100)));
}
// Once a server has answered, a refused connection means it is gone (its host died, or the
// launcher that served it moved on), not that it has yet to start: a reconnection gives up at
// the first refusal, and one that gets no answer at all after this long rather than after the
// whole timeout, so that a rank waiting on a vanished store fails fast.
constexpr auto kReconnect = std::chrono::seconds(2);
}  // namespace

namespace {
std::string secret_from_environment() {
  const char* s = std::getenv("CHORUS_RDZV_SECRET");
  return s ? s : "";
}
}  // namespace

TcpStore::TcpStore(std::string host, int port, std::optional<std::chrono::milliseconds> timeout,
                   std::optional<std::string> secret)
    : Store(timeout.value_or(settings().store_timeout)),
      host_(std::move(host)),
      port_(port),
      secret_(secret ? std::move(*secret) : secret_from_environment()) {
  idle_.push_back(open_connection(this->timeout()));
}

int TcpStore::open_connection(std::chrono::milliseconds timeout, bool refused_is_final) {
  const int fd = net::connect_to(host_, port_, timeout, refused_is_final);
  if (secret_.empty()) return fd;
  try {
    auto ask = [&](auto build, const char* what) {
      wire::Writer w;
      w.u32(0);
      build(w);
      return exchange(fd, w.finish(), 0, what, timeout);
    };
    const std::string challenge =
        wire::Reader(ask([](wire::Writer& w) { w.u8(uint8_t(Command::Hello)); }, "hello")).str();
    if (!challenge.empty())
      ask([&](wire::Writer& w) { w.u8(uint8_t(Command::Auth)).str(hmac_sha256_hex(secret_, challenge)); },
          "the secret's proof");
  } catch (...) {
    close(fd);
    throw;
  }
  return fd;
}

TcpStore::~TcpStore() {
  for (int fd : idle_) close(fd);
}

template <class Build>
std::string TcpStore::call(Build&& build, const std::string& what, std::chrono::milliseconds limit) {
  int fd = -1;
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = ++last_id_;
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  if (fd < 0) {
    if (gone_.load()) throw StoreError(detail::concat(describe(), ": the server has gone away (", what, ")"));
    try {
      fd = open_connection(std::min<std::chrono::milliseconds>(timeout(), kReconnect), /*refused_is_final=*/true);
    } catch (const StoreError&) {
      gone_.store(true);  // once: later calls fail at once instead of trying for kReconnect each
      throw;
    }
  }
  wire::Writer w;
  w.u32(id);
  build(w);
  std::string out;
  try {
    out = exchange(fd, w.finish(), id, what, limit);
  } catch (const StoreError& e) {
    // A connection that timed out on the server's word is still in step; any other is not.
    if (std::string(e.what()).find("timed out") == std::string::npos) {
      close(fd);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(fd);
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(fd);
  return out;
}

std::shared_ptr<TcpStore> TcpStore::serve(const std::string& host, int port,
                                          std::optional<std::chrono::milliseconds> timeout,
                                          std::optional<std::string> secret) {
  const std::string key = secret ? *secret : secret_from_environment();
  auto server = std::make_unique<TcpStoreServer>(host, port, key);
  auto client = std::make_shared<TcpStore>(host, server->port(), timeout, key);
  client->server_ = std::move(server);
  return client;
}

int free_port(const std::string& host) { return net::free_port(host); }

std::string TcpStore::describe() const { return detail::concat("TcpStore ", host_, ":", port_); }

std::string TcpStore::exchange(int fd, const std::string& frame, uint32_t id, const std::string& what,
                               std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  if (!net::send_all(fd, frame.data(), frame.size(), deadline))
    throw StoreError(detail::concat(describe(), ": cannot send ", what, ": the connection failed"));
  std::string buf;
  char chunk[64 * 1024];
  while (true) {
    size_t body = 0;
    if (size_t whole = wire::complete_frame(buf, &body)) {
      wire::Reader r(std::string_view(buf).substr(4, body));
      uint32_t got = r.u32();
      Status status = Status(r.u8());
      std::string rest = buf.substr(4 + 5, body - 5);
      buf.erase(0, whole);
      if (got != id) continue;  // a late answer to a request we gave up on
      if (status == Status::Timeout) throw StoreError(detail::concat(describe(), ": ", what, " timed out"));
      if (status == Status::Error) throw StoreError(wire::Reader(rest).str());
      return rest;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      throw StoreError(detail::concat(describe(), ": no answer to ", what, " within ", limit.count(), " ms"));
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, int(std::min<long long>(left.count(), 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
      throw StoreError(detail::concat(describe(), ": the server closed the connection during ", what));
    if (n > 0) buf.append(chunk, size_t(n));
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
  call([&](wire::Writer& w) { w.u8(uint8_t(Command::Set)).str(key).str(value); }, "set('" + key + "')", timeout());
}

std::string TcpStore::get(const std::string& key) {
  try {
    std::string out = call([&](wire::Writer& w) { w.u8(uint8_t(Command::Get)).str(key).i64(timeout().count()); },
                           "get('" + key + "')", timeout() + reply_grace(timeout()));
    return wire::Reader(out).str();
  } catch (const StoreError& e) {
    if (std::string(e.what()).find("timed out") != std::string::npos)
      throw StoreError(missing_keys_message(describe(), {key}, timeout()));
    throw;
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string out =
      call([&](wire::Writer& w) { w.u8(uint8_t(Command::Add)).str(key).i64(delta); }, "add('" + key + "')", timeout());
  return wire::Reader(out).i64();
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::string out =
      call([&](wire::Writer& w) { w.u8(uint8_t(Command::CompareSet)).str(key).str(expected).str(desired); },
           "compare_set('" + key + "')", timeout());
  return wire::Reader(out).str();
}

void TcpStore::wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) {
  const auto limit = timeout.value_or(this->timeout());
  try {
    call(
        [&](wire::Writer& w) {
          w.u8(uint8_t(Command::Wait)).u32(uint32_t(keys.size()));
          for (const auto& k : keys) w.str(k);
          w.i64(limit.count());
        },
        "wait", limit + reply_grace(TcpStore::timeout()));
  } catch (const StoreError& e) {
    if (std::string(e.what()).find("timed out") == std::string::npos) throw;
    std::vector<std::string> missing;  // name exactly the keys still missing
    for (const auto& k : keys)
      if (!check({k})) missing.push_back(k);
    throw StoreError(missing_keys_message(describe(), missing.empty() ? keys : missing, limit));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return call(
             [&](wire::Writer& w) {
               w.u8(uint8_t(Command::Check)).u32(uint32_t(keys.size()));
               for (const auto& k : keys) w.str(k);
             },
             "check", timeout()) == std::string(1, '\1');
}

bool TcpStore::delete_key(const std::string& key) {
  return call([&](wire::Writer& w) { w.u8(uint8_t(Command::Delete)).str(key); }, "delete_key('" + key + "')",
              timeout()) == std::string(1, '\1');
}

}  // namespace chorus
