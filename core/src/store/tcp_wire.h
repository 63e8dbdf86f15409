// The TcpStore's framing, shared by server and client.
//
// Every message is a frame: u32 body length (little endian), then the body. A request body is
// u32 request id, u8 command, then the command's fields; a response body is u32 request id,
// u8 status, then the result. Strings are u32 length + bytes; integers are 8 bytes LE.
// The request id lets a client drop a late answer to a request it already gave up on.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace chorus::wire {

// Hello asks for a challenge (empty when the server has no secret); Auth answers it with
// HMAC-SHA-256(secret, challenge). A server with a secret refuses every other command on a
// connection that has not answered (Note [The job's secret]).
enum class Command : uint8_t { Set = 1, Get, Add, CompareSet, Wait, Check, Delete, Hello, Auth, kLast = Auth };
enum class Status : uint8_t { Ok = 0, Timeout = 1, Error = 2 };

constexpr uint32_t kMaxFrame = 256u << 20;  // larger frames are malformed

// A frame that does not parse. The server drops the connection that sent it.
class MalformedFrame : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  Writer() { out_.resize(4); }
  Writer& u8(uint8_t v) {
    out_.push_back(char(v));
    return *this;
  }
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(std::string_view s) {
    u32(uint32_t(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& raw(std::string_view s) {
    out_.append(s);
    return *this;
  }
  // One encoded field on its own, for building payloads.
  static std::string field_str(std::string_view s) { return Writer().str(s).out_.substr(4); }
  static std::string field_i64(int64_t v) { return Writer().i64(v).out_.substr(4); }
  // Fills in the length prefix and returns the whole frame.
  std::string finish();

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view body) : in_(body) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  bool done() const { return in_.empty(); }

 private:
  std::string_view take(size_t n);
  std::string_view in_;
};

// If buf starts with a whole frame, returns its body size; 0 if more bytes are needed.
// Throws MalformedFrame if the declared length exceeds kMaxFrame.
size_t complete_frame(std::string_view buf, size_t* body_size);

}  // namespace chorus::wire
