#include "parallel/objects/collective.h"

#include <cstring>

#include "groups/agreement.h"
#include "parallel/objects/codec.h"

namespace chorus::detail {

namespace {

// Tensors this small travel packed together in one buffer; larger ones move on their own,
// straight between tensor memories.
constexpr size_t kPackBelow = 256 * 1024;
// The first broadcast carries the header's length and, when it fits, the header itself.
constexpr size_t kFirstMessage = 4096;

// The header of src's value, or of its failure; the exception to rethrow on src.
struct Produced {
  c10::IValue value;
  Encoded encoded;
  std::exception_ptr error;
};

// Never throws: a failure travels to the other ranks in place of the value (every rank raises).
Produced produce_encoded(const std::function<c10::IValue()>& produce) {
  Produced p;
  const Caught caught = run_caught([&] {
    p.value = produce();
    p.encoded = encode_object(p.value);
  });
  if (caught) {
    p.error = caught.error;
    p.encoded = Encoded{encode_error(caught.message), {}};
  }
  return p;
}

[[noreturn]] void raise_remote(ProcessGroup& g, const char* what, int rank, const std::string& message) {
  throw Error(concat(what, " on group '", g.name(), "': rank ", rank, " failed: ", message));
}

void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

// Moves the tensors' bytes from src: small ones packed in one broadcast, large ones directly.
void broadcast_tensors(Communicator& comm, int src, const std::vector<at::Tensor>& tensors) {
  const bool mine = comm.rank() == src;
  size_t packed = 0;
  for (const auto& t : tensors)
    if (t.nbytes() < kPackBelow) packed += t.nbytes();
  if (packed) {
    std::vector<char> pack(packed);
    size_t at = 0;
    if (mine)
      for (const auto& t : tensors)
        if (t.nbytes() < kPackBelow) {
          if (t.nbytes()) std::memcpy(pack.data() + at, t.data_ptr(), t.nbytes());
          at += t.nbytes();
        }
    comm.broadcast(pack.data(), packed, DataType::UInt8, src);
    if (!mine)
      for (const auto& t : tensors)
        if (t.nbytes() < kPackBelow) {
          if (t.nbytes()) std::memcpy(t.data_ptr(), pack.data() + at, t.nbytes());
          at += t.nbytes();
        }
  }
  for (const auto& t : tensors)
    if (t.nbytes() >= kPackBelow) comm.broadcast(ptr(t), t.nbytes(), DataType::UInt8, src);
}

// What gather_values moves per rank: the header's length, the header, then the tensors' bytes.
std::vector<char> to_blob(const Encoded& e) {
  const uint64_t n = e.header.size();
  std::vector<char> blob(sizeof(n) + n + e.tensor_bytes());
  std::memcpy(blob.data(), &n, sizeof(n));
  std::memcpy(blob.data() + sizeof(n), e.header.data(), n);
  size_t at = sizeof(n) + n;
  for (const auto& t : e.tensors) {
    if (t.nbytes()) std::memcpy(blob.data() + at, t.data_ptr(), t.nbytes());
    at += t.nbytes();
  }
  return blob;
}

std::string_view blob_header(const char* blob) {
  uint64_t n;
  std::memcpy(&n, blob, sizeof(n));
  return std::string_view(blob + sizeof(n), n);
}

}  // namespace

c10::IValue broadcast_value(ProcessGroup& g, int src, const std::function<c10::IValue()>& produce, const char* what) {
  Communicator& comm = g.communicator();
  if (src < 0 || src >= g.size())
    comm.reject(what, concat("source ", src, " is not a rank of this group (size ", g.size(), ")"));
  const bool mine = g.rank() == src;
  Produced p;
  if (mine) p = produce_encoded(produce);
  std::string& header = p.encoded.header;

  std::vector<char> first(kFirstMessage);
  constexpr size_t inline_room = kFirstMessage - sizeof(uint64_t);
  if (mine) {
    const uint64_t n = header.size();
    std::memcpy(first.data(), &n, sizeof(n));
    std::memcpy(first.data() + sizeof(n), header.data(), std::min<size_t>(n, inline_room));
  }
  comm.broadcast(first.data(), first.size(), DataType::UInt8, src);
  if (!mine) {
    uint64_t n;
    std::memcpy(&n, first.data(), sizeof(n));
    header.assign(first.data() + sizeof(n), std::min<size_t>(n, inline_room));
    header.resize(n);
  }
  if (header.size() > inline_room)
    comm.broadcast(header.data() + inline_room, header.size() - inline_room, DataType::UInt8, src);

  if (mine && p.error) std::rethrow_exception(p.error);
  if (auto message = header_error(header)) raise_remote(g, what, src, *message);
  if (mine) {
    broadcast_tensors(comm, src, p.encoded.tensors);
    return p.value;
  }
  auto tensors = allocate_tensors(header);
  broadcast_tensors(comm, src, tensors);
  return decode_object(header, tensors);
}

std::optional<std::vector<c10::IValue>> gather_values(ProcessGroup& g, int dst,
                                                      const std::function<c10::IValue()>& produce, const char* what) {
  Communicator& comm = g.communicator();
  const int w = g.size();
  if (dst >= w) comm.reject(what, concat("destination ", dst, " is not a rank of this group (size ", w, ")"));
  Produced p = produce_encoded(produce);
  // This rank's blob: header length, header, then its tensors' bytes.
  const std::vector<char> blob = to_blob(p.encoded);
  constexpr uint64_t kFailed = uint64_t(1) << 63;
  uint64_t mine = blob.size() | (p.error ? kFailed : 0);
  std::vector<uint64_t> sizes(static_cast<size_t>(w));
  comm.all_gather(&mine, sizes.data(), 1, DataType::Int64);

  bool failed = false;
  for (uint64_t s : sizes) failed = failed || (s & kFailed);
  std::vector<size_t> counts(static_cast<size_t>(w));
  if (failed) {
    // Everyone learns every failure, then raises: the failing ranks their own exception.
    for (int r = 0; r < w; ++r) counts[size_t(r)] = (sizes[size_t(r)] & kFailed) ? sizes[size_t(r)] & ~kFailed : 0;
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<char> all(total);
    comm.all_gather_v(p.error ? blob.data() : nullptr, all.data(), counts, DataType::UInt8);
    if (p.error) std::rethrow_exception(p.error);
    size_t off = 0;
    for (int r = 0; r < w; ++r) {
      if (counts[size_t(r)]) {
        raise_remote(g, what, r, header_error(blob_header(all.data() + off)).value_or("(no message)"));
      }
      off += counts[size_t(r)];
    }
  }
  const bool receive = dst < 0 || dst == g.rank();
  size_t total = 0;
  for (int r = 0; r < w; ++r) total += counts[size_t(r)] = sizes[size_t(r)];
  std::vector<char> all(receive ? total : 0);
  if (dst < 0)
    comm.all_gather_v(blob.data(), all.data(), counts, DataType::UInt8);
  else
    comm.gather_v(blob.data(), receive ? all.data() : nullptr, counts, DataType::UInt8, dst);
  if (!receive) return std::nullopt;

  std::vector<c10::IValue> out;
  size_t off = 0;
  for (int r = 0; r < w; ++r) {
    const char* b = all.data() + off;
    off += counts[size_t(r)];
    if (r == g.rank()) {
      out.push_back(p.value);
      continue;
    }
    const std::string_view h = blob_header(b);
    auto tensors = allocate_tensors(h);
    const char* bytes = h.data() + h.size();
    for (auto& t : tensors) {
      if (t.nbytes()) std::memcpy(t.data_ptr(), bytes, t.nbytes());
      bytes += t.nbytes();
    }
    out.push_back(decode_object(h, tensors));
  }
  return out;
}

void leaders_first(ProcessGroup& g, bool leader, const std::function<void()>& fn, const char* what) {
  gather_values(
      g, -1,
      [&] {
        if (leader) fn();
        return c10::IValue();
      },
      what);
  if (!leader) fn();
}

}  // namespace chorus::detail
