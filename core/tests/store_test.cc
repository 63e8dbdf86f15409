#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/hash_store.h"
#include "chorus/core/prefix_store.h"
#include "chorus/core/tcp_store.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

// The Store contract, run against every implementation.
void exercise(Store& s) {
  s.set("a", "1");
  EXPECT_EQ(s.get("a"), "1");
  s.set("bin", std::string("\0x\xff", 3));
  EXPECT_EQ(s.get("bin"), std::string("\0x\xff", 3));
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.get("n"), "3");
  EXPECT_THROW(s.add("bin", 1), StoreError);
  EXPECT_EQ(s.compare_set("c", "", "first"), "first");
  EXPECT_EQ(s.compare_set("c", "wrong", "second"), "first");
  EXPECT_EQ(s.compare_set("c", "first", "second"), "second");
  EXPECT_EQ(s.compare_set("absent", "x", "y"), "");
  EXPECT_TRUE(s.check({"a", "n"}));
  EXPECT_FALSE(s.check({"a", "nope"}));
  EXPECT_TRUE(s.delete_key("a"));
  EXPECT_FALSE(s.delete_key("a"));
  EXPECT_FALSE(s.check({"a"}));
  // wait returns once another thread sets the key
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    s.set("late", "here");
  });
  s.wait({"late", "n"}, 10s);
  EXPECT_EQ(s.get("late"), "here");
  setter.join();
  try {
    s.wait({"n", "never"}, 100ms);
    FAIL() << "wait did not time out";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("never'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("'n'"), std::string::npos) << e.what();
  }
}

TEST(HashStore, Contract) {
  HashStore s;
  exercise(s);
}

TEST(PrefixStore, ContractAndIsolation) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base), b("b", base);
  exercise(a);
  EXPECT_FALSE(b.check({"n"}));
  EXPECT_EQ(base->get("a/n"), "3");
}

TEST(TcpStore, ContractOverLoopback) {
  auto s = TcpStore::serve("127.0.0.1", 0, 10s);
  EXPECT_GT(s->port(), 0);
  exercise(*s);
  TcpStore other("127.0.0.1", s->port(), 10s);
  EXPECT_EQ(other.get("n"), "3");
}

TEST(TcpStore, GetTimesOutNamingTheKey) {
  auto s = TcpStore::serve("127.0.0.1", 0, 200ms);
  try {
    s->get("missing-key");
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos) << e.what();
  }
  s->set("after", "ok");  // the connection still works
  EXPECT_EQ(s->get("after"), "ok");
}

TEST(TcpStore, SixteenClientsHammerAdd) {
  auto server = TcpStore::serve("127.0.0.1", 0, 30s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([port = server->port()] {
      TcpStore c("127.0.0.1", port, 30s);
      for (int i = 0; i < 500; ++i) c.add("counter", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(server->add("counter", 0), 16 * 500);
}

TEST(TcpStore, UnreachableServerNamesHostAndPort) {
  // Find a port nobody listens on: bind, read it, close.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  try {
    TcpStore c("127.0.0.1", port, 300ms);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// The server drops a connection that sends garbage, and nobody else notices.
bool closed_by_server(int fd) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  return recv(fd, &c, 1, 0) == 0;
}

TEST(TcpStore, MalformedFramesAreRejectedAndOthersKeepWorking) {
  auto server = TcpStore::serve("127.0.0.1", 0, 10s);
  TcpStore good("127.0.0.1", server->port(), 10s);
  good.set("k", "v");

  {  // unknown command
    int fd = raw_connect(server->port());
    const unsigned char frame[] = {5, 0, 0, 0, 1, 0, 0, 0, 99};
    ASSERT_EQ(send(fd, frame, sizeof(frame), 0), ssize_t(sizeof(frame)));
    EXPECT_TRUE(closed_by_server(fd));
    close(fd);
  }
  {  // a string length that runs past the frame
    int fd = raw_connect(server->port());
    const unsigned char frame[] = {9, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0, 0};
    ASSERT_EQ(send(fd, frame, sizeof(frame), 0), ssize_t(sizeof(frame)));
    EXPECT_TRUE(closed_by_server(fd));
    close(fd);
  }
  {  // an absurd frame length
    int fd = raw_connect(server->port());
    const unsigned char frame[] = {0xff, 0xff, 0xff, 0x7f, 1};
    ASSERT_EQ(send(fd, frame, sizeof(frame), 0), ssize_t(sizeof(frame)));
    EXPECT_TRUE(closed_by_server(fd));
    close(fd);
  }
  {  // a truncated frame, then the client vanishes
    int fd = raw_connect(server->port());
    const unsigned char frame[] = {40, 0, 0, 0, 1, 0, 0, 0, 1, 3};
    ASSERT_EQ(send(fd, frame, sizeof(frame), 0), ssize_t(sizeof(frame)));
    close(fd);
  }
  EXPECT_EQ(good.get("k"), "v");
  good.set("k2", "v2");
  EXPECT_EQ(server->get("k2"), "v2");
  EXPECT_EQ(good.add("c", 2), 2);
}

TEST(TcpStore, ServerGoneIsAStoreError) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore c("127.0.0.1", server->port(), 2s);
  c.set("x", "1");
  server.reset();
  EXPECT_THROW(c.get("x"), StoreError);
}

}  // namespace
}  // namespace chorus
