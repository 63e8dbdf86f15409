#include "net/mesh.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "chorus/core/error.h"
#include "engine/engine.h"
#include "store/socket_util.h"

namespace chorus::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x63686f7275734d31ULL;  // "chorusM1"
constexpr size_t kHeader = 2 * sizeof(uint64_t);
constexpr size_t kFoldGrain = 64 << 10;   // fold what arrived once this much is waiting
constexpr size_t kWakeGrain = 256 << 10;  // Note [Waking for bytes]

// What a connecting rank says first: who it is, on which channel, and the token the listener
// published (a stray connection cannot take a rank's place).
struct Hello {
  uint64_t magic, token;
  int32_t rank, channel;
};

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(left, 0, 1000));
}

// The IPv4 address of interface `name`, or "" when it has none.
std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* a = list; a && out.empty(); a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && name == a->ifa_name) {
      char text[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text)) out = text;
    }
  freeifaddrs(list);
  return out;
}

// Where this rank listens: the interface the user named, else the address that routes toward
// MASTER_ADDR (what the other hosts reach), else loopback.
std::string listen_address() {
  for (const char* var : {"CHORUS_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
    if (const char* iface = std::getenv(var); iface && *iface) {
      std::string a = interface_address(iface);
      if (a.empty())
        throw InvalidArgument(detail::concat(var, "=", iface, ": no interface of that name with an IPv4 address"));
      return a;
    }
  const char* master = std::getenv("MASTER_ADDR");
  try {
    return local_address_toward(master && *master ? master : "127.0.0.1", 9);
  } catch (const StoreError&) {
    return "127.0.0.1";
  }
}

bool read_exact(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= size_t(got);
      continue;
    }
    if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (Clock::now() >= deadline) return false;
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, millis_until(deadline));
  }
  return true;
}

}  // namespace

Mesh::Mesh(Store& store, int rank, int size, Clock::time_point deadline)
    : rank_(rank), size_(size), fds_(size_t(size) * kChannels, -1), lowat_(fds_.size(), 1) {
  wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  try {
    connect(store, deadline);
  } catch (...) {
    close_all();  // a constructor that throws runs no destructor
    throw;
  }
}

void Mesh::connect(Store& store, Clock::time_point deadline) {
  const int rank = rank_, size = size_;
  const std::string host = listen_address();
  int port = 0;
  int listener = -1;
  try {
    listener = listen_on(host, 0, &port);
  } catch (const StoreError& e) {
    throw EngineFailure(detail::concat("tcp: rank ", rank, " cannot listen: ", e.what()));
  }
  set_nonblocking(listener);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } close_listener{listener};
  address_ = detail::concat(host, ":", port);
  const uint64_t token = std::random_device{}() * 0x100000001ULL ^ std::random_device{}();
  store.set(detail::concat("tcp/", rank), detail::concat(host, " ", port, " ", token));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::concat("tcp/", r));
  store.wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));

  struct Entry {
    std::string addr;
    int port;
    unsigned long long token;
  };
  std::vector<Entry> entries;
  for (int peer = 0; peer < size; ++peer) {
    const std::string entry = store.get(keys[size_t(peer)]);
    char addr[256] = {0};
    int peer_port = 0;
    unsigned long long peer_token = 0;
    if (std::sscanf(entry.c_str(), "%255s %d %llu", addr, &peer_port, &peer_token) != 3)
      throw EngineFailure(
          detail::concat("tcp: rank ", peer, " published an address that cannot be read: '", entry, "'"));
    entries.push_back({addr, peer_port, peer_token});
    hosts_.push_back(addr);
  }
  // Lower ranks are connected to, higher ranks connect here.
  for (int peer = 0; peer < rank; ++peer) {
    const char* addr = entries[size_t(peer)].addr.c_str();
    const int peer_port = entries[size_t(peer)].port;
    const unsigned long long peer_token = entries[size_t(peer)].token;
    for (int c = 0; c < kChannels; ++c) {
      int fd = -1;
      try {
        fd = connect_to(addr, peer_port,
                        std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
      } catch (const StoreError& e) {
        throw EngineFailure(detail::concat("tcp: rank ", rank, " could not connect to rank ", peer, " at ", addr, ":",
                                           peer_port, " (", e.what(), ")"));
      }
      fds_[size_t(peer) * kChannels + size_t(c)] = fd;
      const Hello hello{kMagic, peer_token, rank, c};
      if (!send_all(fd, reinterpret_cast<const char*>(&hello), sizeof hello, deadline))
        throw EngineFailure(detail::concat("tcp: rank ", rank, " could not greet rank ", peer, " at ", addr));
    }
  }
  int expected = (size - 1 - rank) * kChannels;
  while (expected > 0) {
    pollfd pfd{listener, POLLIN, 0};
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer)
        if (fds_[size_t(peer) * kChannels + kChannels - 1] < 0)
          missing += detail::concat(missing.empty() ? "" : ", ", peer);
      throw EngineFailure(
          detail::concat("tcp: rank ", rank, " at ", address_, " was not reached by rank(s) ", missing));
    }
    if (poll(&pfd, 1, millis_until(deadline)) <= 0) continue;
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello hello{};
    const bool read = read_exact(fd, &hello, sizeof hello, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
    const bool ours = read && hello.magic == kMagic && hello.token == token && hello.rank > rank && hello.rank < size &&
                      hello.channel >= 0 && hello.channel < kChannels;
    const size_t at = ours ? size_t(hello.rank) * kChannels + size_t(hello.channel) : 0;
    if (!ours || fds_[at] >= 0) {  // a stranger, or a second greeting for one channel
      ::close(fd);
      continue;
    }
    fds_[at] = fd;
    --expected;
  }
  for (int fd : fds_)
    if (fd >= 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      set_nonblocking(fd);
    }
}

Mesh::~Mesh() { close_all(); }

void Mesh::close_all() {
  for (int& fd : fds_)
    if (fd >= 0) ::close(std::exchange(fd, -1));
  if (wake_ >= 0) ::close(std::exchange(wake_, -1));
}

void Mesh::interrupt() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_, &one, sizeof one);
}

void Mesh::check_interrupt(bool readable) const {
  if (readable) throw EngineFailure("interrupted: the group is aborting");
}

void Mesh::broken(const Transfer& t, const std::string& why) const {
  throw EngineFailure(detail::concat("tcp: ", t.send ? "sending " : "receiving ", t.bytes, " bytes ",
                                     t.send ? "to" : "from", " rank ", t.peer, ": ", why));
}

bool Mesh::advance(Transfer& t) {
  const int s = fd(t.peer, t.channel);
  for (;;) {
    if (t.header_done == kHeader && t.done == t.bytes) return true;
    ssize_t n;
    if (t.send) {
      iovec iov[2];
      int count = 0;
      if (t.header_done < kHeader)
        iov[count++] = {reinterpret_cast<uint8_t*>(t.header) + t.header_done, kHeader - t.header_done};
      if (t.done < t.bytes) iov[count++] = {t.data + t.done, t.bytes - t.done};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = size_t(count);
      n = ::sendmsg(s, &msg, MSG_NOSIGNAL);
    } else if (t.header_done < kHeader) {
      n = ::recv(s, reinterpret_cast<uint8_t*>(t.header) + t.header_done, kHeader - t.header_done, 0);
    } else {
      n = ::recv(s, t.data + t.done, t.bytes - t.done, 0);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      broken(t, std::strerror(errno));
    }
    if (n == 0 && !t.send) broken(t, "the connection was closed (the rank ended or gave up)");
    size_t got = size_t(n);
    if (t.header_done < kHeader) {
      const size_t h = std::min(got, kHeader - t.header_done);
      t.header_done += h;
      got -= h;
      if (!t.send && t.header_done == kHeader) {
        if (t.header[0] != kMagic) broken(t, "the stream is corrupt (no message header where one was due)");
        if (t.header[1] != t.bytes)
          broken(t, detail::concat("the rank sent ", t.header[1], " bytes (the ranks' calls differ)"));
      }
    }
    t.done += got;
    if (t.fold && (t.done - t.folded >= kFoldGrain || t.done == t.bytes)) {
      const size_t upto = t.done - t.done % t.elem;
      const uint8_t* from = t.fold_from ? t.fold_from : t.fold_into;
      (*t.fold)(t.fold_into + t.folded, from + t.folded, t.data + t.folded, (upto - t.folded) / t.elem);
      t.folded = upto;
    }
  }
}

// Note [Waking for bytes]: a receive of many bytes would wake this rank for every few packets
// that land (a poll, a recv and a context switch each; with more ranks than cores, a core
// changing hands each time). While more than kWakeGrain bytes are still due, the socket's
// SO_RCVLOWAT asks the kernel to wake it only once kWakeGrain have arrived; for the last ones,
// and after the call, it is back to one byte, so no poll ever waits for bytes that will not come.
// A closed connection still wakes it at once.
void Mesh::wake_after(const Transfer& t, int bytes) {
  const size_t at = size_t(t.peer) * kChannels + size_t(t.channel);
  if (lowat_[at] == bytes) return;
  setsockopt(fds_[at], SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes);
  lowat_[at] = bytes;
}

void Mesh::run(std::vector<Transfer>& ts, Clock::time_point deadline) {
  for (auto& t : ts) {
    t.header[0] = t.send ? kMagic : 0;
    t.header[1] = t.send ? t.bytes : 0;
    t.header_done = t.done = t.folded = 0;
  }
  struct Reset {  // every socket back to waking for one byte, however the call ends
    Mesh& m;
    std::vector<Transfer>& ts;
    ~Reset() {
      for (const auto& t : ts)
        if (!t.send) m.wake_after(t, 1);
    }
  } reset{*this, ts};
  std::vector<pollfd> pfds;
  std::vector<size_t> waiting;
  for (;;) {
    waiting.clear();
    for (size_t i = 0; i < ts.size(); ++i)
      if (!advance(ts[i])) waiting.push_back(i);
    if (waiting.empty()) return;
    pfds.clear();
    for (size_t i : waiting) {
      const Transfer& t = ts[i];
      if (!t.send) wake_after(t, kHeader - t.header_done + t.bytes - t.done > kWakeGrain ? int(kWakeGrain) : 1);
      pfds.push_back({fd(t.peer, t.channel), short(t.send ? POLLOUT : POLLIN), 0});
    }
    pfds.push_back({wake_, POLLIN, 0});
    const int ready = poll(pfds.data(), pfds.size(), millis_until(deadline));
    check_interrupt(pfds.back().revents & POLLIN);
    if (ready == 0 && Clock::now() >= deadline) {
      std::string who;
      for (size_t i : waiting)
        who += detail::concat(who.empty() ? "" : ", ", ts[i].send ? "sending to rank " : "receiving from rank ",
                              ts[i].peer);
      throw EngineFailure(detail::concat("tcp: timed out ", who));
    }
  }
}

void Mesh::run_any(Transfer& t, const std::vector<int>& peers, Clock::time_point deadline) {
  std::vector<pollfd> pfds;
  for (int p : peers) pfds.push_back({fd(p, t.channel), POLLIN, 0});
  pfds.push_back({wake_, POLLIN, 0});
  for (;;) {
    const int ready = poll(pfds.data(), pfds.size(), millis_until(deadline));
    check_interrupt(pfds.back().revents & POLLIN);
    for (size_t i = 0; i + 1 < pfds.size(); ++i)
      if (pfds[i].revents) {
        t.peer = peers[i];
        std::vector<Transfer> one{t};
        run(one, deadline);
        t = one[0];
        return;
      }
    if (ready == 0 && Clock::now() >= deadline)
      throw EngineFailure("tcp: timed out waiting for a message from any rank");
  }
}

}  // namespace chorus::net
