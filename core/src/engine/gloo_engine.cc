// The Gloo engine: Gloo's own algorithms over its TCP transport (ring all-reduce, ...), and
// its unbound buffers for what Gloo lacks (gather with uneven sizes, point to point).
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "chorus/core/error.h"
#include "chorus/core/store.h"
#include "engine/engine.h"

namespace chorus {
namespace {

// Gloo's rendezvous through the group's chorus store.
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStore(chorus::Store& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set("gloo/" + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_.wait({"gloo/" + key}, std::nullopt);
    std::string v = store_.get("gloo/" + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> k;
    for (const auto& key : keys) k.push_back("gloo/" + key);
    store_.wait(k, timeout);
  }

 private:
  chorus::Store& store_;
};

// The local address a connection toward `host` leaves from: the one peers on that side reach.
std::string address_toward(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {  // UDP: nothing is sent
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN];
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
      out = text;
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

::gloo::transport::tcp::attr device_attr() {
  ::gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) {
    attr.iface = iface;
    return attr;
  }
  const char* master = std::getenv("MASTER_ADDR");
  attr.hostname = address_toward(master && *master ? master : "127.0.0.1");
  return attr;
}

// Gloo writes to its sockets with writev, which raises SIGPIPE when the peer has died, and
// SIGPIPE's default action ends the process before the error can name the peer. Ignore it,
// unless the program chose a handler of its own (Python programs, torch's among them, ignore
// it already).
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  });
}

// Note [Interrupting Gloo]: a Gloo wait ends when its operation completes, when the operation
// is failed by its connection's error, or at its timeout, and nothing else wakes it. This Gloo has
// no abort; closeConnections() closes the sockets without failing the operations pending on
// them; and a send already half written when its peer gave up is never failed at all. So a rank
// whose peer gave up in the middle of a collective could sleep until its deadline (30 minutes
// by default) although the watchdog knew within a second. What does wake a wait is its
// buffer's abortWait: every Gloo algorithm makes its buffers through the context's transport,
// so after connecting, the transport is wrapped in one that hands out buffers it can abort.
// interrupt() aborts the live ones, and from then on every wait throws.
struct Interruption {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::set<::gloo::transport::UnboundBuffer*> live;  // the wrapped Gloo buffers

  void trigger() {
    std::lock_guard<std::mutex> lock(mu);
    on = true;  // before the aborts: an aborted wait then sees it and throws
    for (auto* b : live) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }
};

class AbortableBuffer : public ::gloo::transport::UnboundBuffer {
 public:
  AbortableBuffer(std::unique_ptr<::gloo::transport::UnboundBuffer> inner, std::shared_ptr<Interruption> in)
      : UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), in_(std::move(in)) {
    std::lock_guard<std::mutex> lock(in_->mu);
    in_->live.insert(inner_.get());
  }
  ~AbortableBuffer() override {
    std::lock_guard<std::mutex> lock(in_->mu);
    in_->live.erase(inner_.get());
  }
  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return checked(inner_->waitRecv(rank, timeout));
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return checked(inner_->waitSend(rank, timeout));
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    interrupted();
    inner_->send(dst, slot, offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    interrupted();
    inner_->recv(src, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    interrupted();
    inner_->recv(std::move(srcs), slot, offset, nbytes);
  }

 private:
  void interrupted() const {
    if (in_->on) throw ::gloo::IoException("interrupted: the group is aborting");
  }
  bool checked(bool completed) const {
    interrupted();  // an aborted wait returns false; one that completed meanwhile counts for nothing
    return completed;
  }
  std::unique_ptr<::gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<Interruption> in_;
};

// Forwards to Gloo's own transport; only its buffers are wrapped.
class AbortableTransport : public ::gloo::transport::Context {
 public:
  AbortableTransport(std::shared_ptr<::gloo::transport::Context> inner, std::shared_ptr<Interruption> in)
      : Context(inner->rank, inner->size), inner_(std::move(inner)), in_(std::move(in)) {
    setTimeout(inner_->getTimeout());
  }
  std::unique_ptr<::gloo::transport::Pair>& getPair(int rank) override { return inner_->getPair(rank); }
  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override { return inner_->createPair(rank); }
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<AbortableBuffer>(inner_->createUnboundBuffer(ptr, size), in_);
  }

 private:
  std::shared_ptr<::gloo::transport::Context> inner_;
  std::shared_ptr<Interruption> in_;
};

class InterruptibleContext : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;
  // After connectFullMesh: every buffer made from now on can be aborted.
  void make_abortable() { transportContext_ = std::make_shared<AbortableTransport>(transportContext_, interruption_); }
  void interrupt() {
    interruption_->trigger();
    closeConnections();  // the peers' operations with this rank fail at once
  }

 private:
  std::shared_ptr<Interruption> interruption_ = std::make_shared<Interruption>();
};

// Slots of the point-to-point channels and of gather_v; Gloo's collectives use prefixes below.
constexpr uint8_t kDataSlot = 0xC0, kAckSlot = 0xC1, kGatherSlot = 0xC2;

class GlooEngine : public Engine {
 public:
  GlooEngine(chorus::Store& store, int rank, int size, Millis left) : rank_(rank), size_(size) {
    ignore_sigpipe();
    GlooStore gs(store);
    auto context = std::make_shared<InterruptibleContext>(rank, size);
    context->setTimeout(left);
    guard("connecting", [&] {
      auto device = ::gloo::transport::tcp::CreateDevice(device_attr());
      context->connectFullMesh(gs, device);
    });
    context->make_abortable();
    context_ = context;
  }

  std::string name() const override { return "gloo"; }

  void barrier(Millis left) override {
    ::gloo::BarrierOptions o(context_);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("barrier", [&] { ::gloo::barrier(o); });
  }

  void all_reduce(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    ::gloo::AllreduceOptions o(context_);
    set_buffers(o, in, out, count, r.elem());
    o.setReduceFunction(r.fold);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("all_reduce", [&] { ::gloo::allreduce(o); });
  }

  void reduce(const void* in, void* out, size_t count, const Reduction& r, int root, Millis left) override {
    ::gloo::ReduceOptions o(context_);
    set_buffers(o, in, out, count, r.elem());
    o.setRoot(root);
    o.setReduceFunction(r.fold);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("reduce", [&] { ::gloo::reduce(o); });
  }

  // Gloo has no reduce-scatter: reduce everything, keep this rank's block.
  void reduce_scatter(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    const size_t bytes = count * r.elem();
    std::vector<uint8_t> all(bytes * size_t(size_));
    all_reduce(in, all.data(), count * size_t(size_), r, left);
    std::memcpy(out, all.data() + size_t(rank_) * bytes, bytes);
  }

  void broadcast(void* buf, size_t bytes, int root, Millis left) override {
    ::gloo::BroadcastOptions o(context_);
    o.setOutput(static_cast<uint8_t*>(buf), bytes);
    o.setRoot(root);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("broadcast", [&] { ::gloo::broadcast(o); });
  }

  void all_gather(const void* in, void* out, size_t bytes, Millis left) override {
    ::gloo::AllgatherOptions o(context_);
    o.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
    o.setOutput(static_cast<uint8_t*>(out), bytes * size_t(size_));
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("all_gather", [&] { ::gloo::allgather(o); });
  }

  void all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes, Millis left) override {
    ::gloo::AllgathervOptions o(context_);
    o.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes[size_t(rank_)]);
    o.setOutput(static_cast<uint8_t*>(out), bytes);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("all_gather_v", [&] { ::gloo::allgatherv(o); });
  }

  void gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root, Millis left) override {
    const auto slot = ::gloo::Slot::build(kGatherSlot, next_tag());
    guard("gather", [&] {
      if (rank_ != root) {
        if (!bytes[size_t(rank_)]) return;
        auto buf = context_->createUnboundBuffer(const_cast<void*>(in), bytes[size_t(rank_)]);
        buf->send(root, slot);
        buf->waitSend(left);
        return;
      }
      size_t total = 0;
      for (size_t b : bytes) total += b;
      auto buf = context_->createUnboundBuffer(out, total);
      size_t offset = 0, pending = 0;
      for (int p = 0; p < size_; ++p) {
        const size_t n = bytes[size_t(p)];
        if (p == rank_ && n)
          std::memcpy(static_cast<uint8_t*>(out) + offset, in, n);
        else if (n) {
          buf->recv(p, slot, offset, n);
          ++pending;
        }
        offset += n;
      }
      for (; pending; --pending) buf->waitRecv(left);
    });
  }

  void scatter(const void* in, void* out, size_t bytes, int root, Millis left) override {
    ::gloo::ScatterOptions o(context_);
    if (rank_ == root) {
      std::vector<uint8_t*> blocks;
      for (int p = 0; p < size_; ++p)
        blocks.push_back(static_cast<uint8_t*>(const_cast<void*>(in)) + size_t(p) * bytes);
      o.setInputs(blocks, bytes);
    }
    o.setOutput(static_cast<uint8_t*>(out), bytes);
    o.setRoot(root);
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("scatter", [&] { ::gloo::scatter(o); });
  }

  void all_to_all_v(const void* in, const std::vector<size_t>& send_bytes, void* out,
                    const std::vector<size_t>& recv_bytes, Millis left) override {
    ::gloo::AlltoallvOptions o(context_);
    // Gloo copies this rank's own block with memcpy even when it is empty: never hand it null.
    static uint8_t nothing;
    o.setInput(in ? static_cast<uint8_t*>(const_cast<void*>(in)) : &nothing,
               std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
    o.setOutput(out ? static_cast<uint8_t*>(out) : &nothing,
                std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
    o.setTag(next_tag());
    o.setTimeout(left);
    guard("all_to_all_v", [&] { ::gloo::alltoallv(o); });
  }

  void send(const void* buf, size_t bytes, int dst, bool ack, Millis left) override {
    guard("send", [&] {
      auto b = context_->createUnboundBuffer(const_cast<void*>(buf), bytes);
      b->send(dst, ::gloo::Slot::build(ack ? kAckSlot : kDataSlot, 0));
      b->waitSend(left);
    });
  }

  void recv(void* buf, size_t bytes, int src, bool ack, Millis left) override {
    guard("recv", [&] {
      auto b = context_->createUnboundBuffer(buf, bytes);
      b->recv(src, ::gloo::Slot::build(ack ? kAckSlot : kDataSlot, 0));
      b->waitRecv(left);
    });
  }

  int recv_any(void* buf, size_t bytes, Millis left) override {
    int from = -1;
    guard("recv", [&] {
      std::vector<int> peers;
      for (int p = 0; p < size_; ++p)
        if (p != rank_) peers.push_back(p);
      auto b = context_->createUnboundBuffer(buf, bytes);
      b->recv(std::move(peers), ::gloo::Slot::build(kDataSlot, 0));  // Gloo takes the first sender
      b->waitRecv(&from, left);
    });
    return from;
  }

  void interrupt() override {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    if (interrupted_) return;
    interrupted_ = true;
    try {
      context_->interrupt();  // Note [Interrupting Gloo]
    } catch (const std::exception&) {
    }
  }
  bool can_interrupt() const override { return true; }

 private:
  // Gloo types buffers by a C++ type only to learn the element size; the fold does the typing.
  // Without an input, Gloo reduces in place in the output.
  template <class Options>
  static void set_buffers(Options& o, const void* in, void* out, size_t count, size_t elem) {
    auto set = [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      if (in != out) o.template setInput<T>(static_cast<T*>(const_cast<void*>(in)), count);
      o.template setOutput<T>(static_cast<T*>(out), count);
    };
    switch (elem) {
      case 1: return set(static_cast<uint8_t*>(nullptr));
      case 2: return set(static_cast<uint16_t*>(nullptr));
      case 4: return set(static_cast<uint32_t*>(nullptr));
      default: return set(static_cast<uint64_t*>(nullptr));
    }
  }

  uint32_t next_tag() { return tag_++; }

  template <class F>
  void guard(const char* what, F&& f) {
    try {
      f();
    } catch (const ::gloo::Exception& e) {
      throw EngineFailure(detail::concat(what, ": ", e.what()));
    } catch (const chorus::Error&) {
      throw;
    } catch (const std::exception& e) {  // Gloo's enforce failures
      throw EngineFailure(detail::concat(what, ": ", e.what()));
    }
  }

  const int rank_, size_;
  std::shared_ptr<InterruptibleContext> context_;
  uint32_t tag_ = 1;
  std::mutex interrupt_mu_;
  bool interrupted_ = false;
};

}  // namespace

std::unique_ptr<Engine> make_gloo_engine(chorus::Store& store, int rank, int size, Millis left) {
  return std::make_unique<GlooEngine>(store, rank, size, left);
}

}  // namespace chorus
