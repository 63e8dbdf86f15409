#include "store/tcp_wire.h"

#include <cstring>

namespace chorus::wire {

Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  uint64_t u = uint64_t(v);
  for (int i = 0; i < 8; ++i) out_.push_back(char((u >> (8 * i)) & 0xff));
  return *this;
}

std::string Writer::finish() {
  uint32_t n = uint32_t(out_.size() - 4);
  for (int i = 0; i < 4; ++i) out_[i] = char((n >> (8 * i)) & 0xff);
  return std::move(out_);
}

std::string_view Reader::take(size_t n) {
  if (in_.size() < n) throw MalformedFrame("frame ends inside a field");
  auto s = in_.substr(0, n);
  in_.remove_prefix(n);
  return s;
}

uint8_t Reader::u8() { return uint8_t(take(1)[0]); }

uint32_t Reader::u32() {
  auto s = take(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(s[i])) << (8 * i);
  return v;
}

int64_t Reader::i64() {
  auto s = take(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(s[i])) << (8 * i);
  return int64_t(v);
}

std::string Reader::str() {
  uint32_t n = u32();
  return std::string(take(n));
}

size_t complete_frame(std::string_view buf, size_t* body_size) {
  if (buf.size() < 4) return 0;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t(uint8_t(buf[i])) << (8 * i);
  if (n > kMaxFrame) throw MalformedFrame("frame length " + std::to_string(n) + " exceeds the limit");
  if (buf.size() < 4 + size_t(n)) return 0;
  *body_size = n;
  return 4 + size_t(n);
}

}  // namespace chorus::wire
