// Note [Checkpoint files]
// Nothing a reader can see is ever half written: a file is written under a temporary name in its
// own directory, fsynced, renamed over its final name, and the directory fsynced (a rename is
// atomic in POSIX file systems; the fsyncs make it survive a power cut, not only a killed
// process). The sharded format writes its data files under names no earlier save used and its
// metadata file last, by that rename: the metadata names the data files, so until it is replaced
// the previous checkpoint is whole (and its files are kept), and after it the new one is.
// Small files (the metadata) are sealed: a magic line, the payload's length and XXH3-64, then the
// payload, so a truncated or damaged file is recognised before it is parsed. Tensor bytes carry
// their own checksums in the metadata.
#include "parallel/checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "groups/tensor_util.h"

namespace chorus::detail::checkpoint {

namespace {

constexpr char kMagic[] = "chorus checkpoint 1\n";  // 20 bytes
constexpr size_t kMagicSize = sizeof(kMagic) - 1;

std::string os_error(const std::string& what, const std::string& path) {
  return concat(what, " '", path, "': ", std::strerror(errno));
}

// XXH3-64 over bytes given in pieces.
class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t n) { XXH3_64bits_update(st_, data, n); }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }

 private:
  XXH3_state_t* st_;
};

std::string random_suffix() {
  std::random_device rd;
  return concat(std::hex, rd(), rd());
}

}  // namespace

uint64_t checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint64_t checksum(const File& f, int64_t offset, int64_t n) {
  Hasher h;
  std::vector<char> buf(size_t(std::min<int64_t>(n, int64_t(8) << 20)));
  while (n > 0) {
    const size_t k = size_t(std::min<int64_t>(n, int64_t(buf.size())));
    f.read_at(buf.data(), k, offset);
    h.update(buf.data(), k);
    offset += int64_t(k);
    n -= int64_t(k);
  }
  return h.digest();
}

File File::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(os_error("checkpoint: cannot create", path));
  return File(fd, path);
}

File File::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw InvalidArgument(concat("checkpoint: file '", path, "' is missing"));
    throw InvalidArgument(os_error("checkpoint: cannot open", path));
  }
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_at(const void* data, size_t n, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::pwrite(fd_, p, std::min<size_t>(n, size_t(64) << 20), offset);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw Error(os_error("checkpoint: cannot write", path_));
    }
    // Start the disk writing what is written now, while the next part is copied: the fsync at
    // the end then waits for less. (Advice only: an error here shows again at the fsync.)
    ::sync_file_range(fd_, offset, k, SYNC_FILE_RANGE_WRITE);
    p += k;
    n -= size_t(k);
    offset += k;
  }
}

uint64_t File::write_hashed_at(const void* data, size_t n, int64_t offset) {
  constexpr size_t kChunk = size_t(2) << 20;
  Hasher h;
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n; done += kChunk) {
    const size_t k = std::min(kChunk, n - done);
    h.update(p + done, k);
    write_at(p + done, k, offset + int64_t(done));
  }
  return h.digest();
}

void File::read_at(void* data, size_t n, int64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::pread(fd_, p, std::min<size_t>(n, size_t(1) << 30), offset);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument(os_error("checkpoint: cannot read", path_));
    }
    if (k == 0)
      throw InvalidArgument(concat("checkpoint: file '", path_, "' is truncated: it ends at byte ", offset, ", ", n,
                                   " bytes before what the checkpoint wrote"));
    p += k;
    n -= size_t(k);
    offset += k;
  }
}

int64_t File::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw InvalidArgument(os_error("checkpoint: cannot stat", path_));
  return int64_t(st.st_size);
}

void File::sync() {
  if (::fsync(fd_) != 0) throw Error(os_error("checkpoint: cannot fsync", path_));
}

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(os_error("checkpoint: cannot open directory", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(os_error("checkpoint: cannot fsync directory", dir));
}

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = concat(path, ".tmp-", random_suffix());
  try {
    File f = File::create(tmp);
    f.write_at(bytes.data(), bytes.size(), 0);
    f.sync();
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = os_error("checkpoint: cannot rename to", path);
    std::filesystem::remove(tmp);
    throw Error(err);
  }
  sync_dir(std::filesystem::path(path).parent_path().string());
}

std::vector<char> seal(const std::vector<char>& payload) {
  std::vector<char> out(kMagic, kMagic + kMagicSize);
  const uint64_t header[2] = {uint64_t(payload.size()), checksum(payload.data(), payload.size())};
  const char* h = reinterpret_cast<const char*>(header);
  out.insert(out.end(), h, h + sizeof(header));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<char> open_sealed(const std::vector<char>& bytes, const std::string& path) {
  if (bytes.size() < kMagicSize || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0)
    throw InvalidArgument(concat("checkpoint: '", path, "' is not a chorus checkpoint file (no chorus header)"));
  uint64_t header[2];
  if (bytes.size() < kMagicSize + sizeof(header))
    throw InvalidArgument(concat("checkpoint: '", path, "' is truncated (", bytes.size(), " bytes)"));
  std::memcpy(header, bytes.data() + kMagicSize, sizeof(header));
  const size_t start = kMagicSize + sizeof(header);
  if (bytes.size() - start != header[0])
    throw InvalidArgument(concat("checkpoint: '", path, "' is truncated or extended: ", bytes.size() - start,
                                 " bytes of payload, ", header[0], " written"));
  std::vector<char> payload(bytes.begin() + long(start), bytes.end());
  if (checksum(payload.data(), payload.size()) != header[1])
    throw InvalidArgument(concat("checkpoint: '", path, "' is corrupt (its checksum does not match)"));
  return payload;
}

std::vector<char> read_whole(const std::string& path) {
  File f = File::open(path);
  std::vector<char> bytes(size_t(f.size()));
  f.read_at(bytes.data(), bytes.size(), 0);
  return bytes;
}

}  // namespace chorus::detail::checkpoint
