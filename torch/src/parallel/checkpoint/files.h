// The file side of checkpoints: whole reads and writes with errors that name the file, fsync and
// atomic renames, checksums, and the sealed container of small files (Note [Checkpoint files] in
// files.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/process_group.h"

namespace chorus::detail::checkpoint {

// XXH3-64 of the bytes.
uint64_t checksum(const void* data, size_t n);

// An open file; closed by the destructor. Errors name the path.
class File {
 public:
  static File create(const std::string& path);  // truncates
  static File open(const std::string& path);    // read-only; InvalidArgument naming it when missing
  File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  File(const File&) = delete;
  ~File();
  void write_at(const void* data, size_t n, int64_t offset);
  // The same, returning the bytes' XXH3-64: each few MiB is hashed and then written while it is
  // still in the CPU's cache, so the bytes come from memory once.
  uint64_t write_hashed_at(const void* data, size_t n, int64_t offset);
  // InvalidArgument ("truncated") when the file ends first.
  void read_at(void* data, size_t n, int64_t offset) const;
  int64_t size() const;
  void sync();  // fsync
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

// XXH3-64 of n bytes of f from offset, read in pieces.
uint64_t checksum(const File& f, int64_t offset, int64_t n);

// fsync of a directory (after a rename in it).
void sync_dir(const std::string& dir);
// Writes `bytes` under a temporary name next to `path`, fsyncs, renames over `path`, fsyncs the
// directory: `path` holds the old bytes or the new ones, never a part.
void write_atomically(const std::string& path, const std::vector<char>& bytes);
// A sealed blob: a magic line, the payload's length and checksum, the payload. open_sealed
// throws InvalidArgument naming `path` and what is wrong (not a chorus file, truncated, corrupt).
std::vector<char> seal(const std::vector<char>& payload);
std::vector<char> open_sealed(const std::vector<char>& bytes, const std::string& path);
std::vector<char> read_whole(const std::string& path);

}  // namespace chorus::detail::checkpoint
