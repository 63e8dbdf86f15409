// torch's c10d TCPStore protocol (torch 2.x): a request is one query byte, then its arguments in
// host byte order; strings and byte vectors are a uint64 length and the bytes. A connection first
// says VALIDATE 0 with the uint32 magic number 0x3C85F7CE (no answer; the server closes a
// connection that does not). Queries: SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5 (answer:
// READY 0 / NOT_READY 1), WAIT 6 (answer STOP_WAITING 0 once every key exists; the server holds
// it until then), DELETE_KEY 8 (answer: int64 count). (torch 1.13 had no VALIDATE, and each
// query one less.)
#include "chorus/core/torch_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "chorus/core/error.h"
#include "chorus/core/settings.h"
#include "store/socket_util.h"
#include "store/store_util.h"

namespace chorus {

using Clock = std::chrono::steady_clock;

namespace {
enum Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kDeleteKey = 8
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;

struct Frame {
  std::string bytes;
  explicit Frame(Query q) { bytes.push_back(char(q)); }
  template <class T>
  Frame& value(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Frame& str(const std::string& s) {
    value<uint64_t>(s.size());
    bytes += s;
    return *this;
  }
};
}  // namespace

class TorchStore::Connection {
 public:
  Connection(const std::string& host, int port, std::chrono::milliseconds timeout)
      : fd_(net::connect_to(host, port, timeout)) {
    if (!send(Frame(kValidate).value(kValidationMagic).bytes, Clock::now() + timeout)) {
      close(fd_);
      throw StoreError(detail::concat("torch TCPStore ", host, ":", port, ": the connection failed at its start"));
    }
  }
  ~Connection() { close(fd_); }

  // Sends the request; false when the connection failed.
  bool send(const std::string& request, Clock::time_point deadline) {
    return net::send_all(fd_, request.data(), request.size(), deadline);
  }
  // Reads exactly n bytes before the deadline: 1 done, 0 timed out, -1 connection failed.
  int read(void* out, size_t n, Clock::time_point deadline) {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return 0;
      pollfd pf{fd_, POLLIN, 0};
      int rc = poll(&pf, 1, int(std::min<long long>(left, 1 << 30)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) continue;
      ssize_t got = recv(fd_, p, n, 0);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) return -1;
      p += got;
      n -= size_t(got);
    }
    return 1;
  }

 private:
  int fd_;
};

TorchStore::TorchStore(std::string host, int port, std::optional<std::chrono::milliseconds> timeout)
    : Store(timeout.value_or(settings().store_timeout)), host_(std::move(host)), port_(port) {
  idle_.push_back(std::make_unique<Connection>(host_, port_, this->timeout()));
}

TorchStore::~TorchStore() = default;

std::string TorchStore::describe() const { return detail::concat("torch TCPStore ", host_, ":", port_); }

std::unique_ptr<TorchStore::Connection> TorchStore::borrow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return std::make_unique<Connection>(host_, port_, timeout());
}

void TorchStore::give_back(std::unique_ptr<Connection> c) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(c));
}

namespace {
[[noreturn]] void answer_failed(const std::string& where, const std::string& what, int rc) {
  throw StoreError(detail::concat(where, ": ", rc == 0 ? "no answer to " : "the connection closed during ", what));
}

std::string keys_request(Query q, const std::vector<std::string>& keys) {
  Frame f(q);
  f.value<uint64_t>(keys.size());
  for (const auto& k : keys) f.str(k);
  return f.bytes;
}
}  // namespace

template <class Answer>
Answer TorchStore::ask(const std::string& request, const std::string& what) {
  auto c = borrow();
  const auto deadline = Clock::now() + timeout();
  if (!c->send(request, deadline)) answer_failed(describe(), what, -1);
  Answer answer{};
  int rc;
  if constexpr (std::is_same_v<Answer, std::string>) {
    uint64_t n = 0;
    rc = c->read(&n, sizeof(n), deadline);
    if (rc == 1 && n) {
      answer.resize(n);
      rc = c->read(answer.data(), n, deadline);
    }
  } else {
    rc = c->read(&answer, sizeof(answer), deadline);
  }
  if (rc != 1) answer_failed(describe(), what, rc);
  give_back(std::move(c));
  return answer;
}

void TorchStore::set(const std::string& key, const std::string& value) {
  auto c = borrow();
  if (!c->send(Frame(kSet).str(key).str(value).bytes, Clock::now() + timeout()))
    throw StoreError(detail::concat(describe(), ": cannot send set('", key, "'): the connection failed"));
  give_back(std::move(c));
}

std::string TorchStore::get(const std::string& key) {
  wait({key}, timeout());
  return ask<std::string>(Frame(kGet).str(key).bytes, "get('" + key + "')");
}

int64_t TorchStore::add(const std::string& key, int64_t delta) {
  return ask<int64_t>(Frame(kAdd).str(key).value<int64_t>(delta).bytes, "add('" + key + "')");
}

std::string TorchStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return ask<std::string>(Frame(kCompareSet).str(key).str(expected).str(desired).bytes, "compare_set('" + key + "')");
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  return ask<uint8_t>(keys_request(kCheck, keys), "check") == 0;  // READY
}

void TorchStore::wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) {
  const auto limit = timeout.value_or(this->timeout());
  auto c = borrow();
  const auto deadline = Clock::now() + limit;
  if (!c->send(keys_request(kWait, keys), deadline)) answer_failed(describe(), "wait", -1);
  uint8_t answer = 1;
  int rc = c->read(&answer, 1, deadline);
  if (rc == 0) {
    // The server still holds the request: this connection is out of step, drop it.
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!check({k})) missing.push_back(k);
    throw StoreError(missing_keys_message(describe(), missing.empty() ? keys : missing, limit));
  }
  if (rc < 0) answer_failed(describe(), "wait", rc);
  give_back(std::move(c));
}

bool TorchStore::delete_key(const std::string& key) {
  return ask<int64_t>(Frame(kDeleteKey).str(key).bytes, "delete_key('" + key + "')") == 1;
}

}  // namespace chorus
