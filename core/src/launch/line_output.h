// Whole lines from a worker's pipe to this process's stdout or stderr, optionally prefixed and
// copied to a log file. One write() per line, so lines of different workers never interleave.
#pragma once

#include <cstdio>
#include <string>

namespace chorus::launch {

class LineOutput {
 public:
  LineOutput(int to_fd, std::string prefix, FILE* log) : to_fd_(to_fd), prefix_(std::move(prefix)), log_(log) {}
  // Takes bytes read from the pipe; emits every complete line.
  void feed(const char* data, size_t n);
  // The pipe closed: emits what is left as a last line.
  void finish();

 private:
  void emit(const char* line, size_t n);
  int to_fd_;
  std::string prefix_;
  FILE* log_;
  std::string pending_;
};

}  // namespace chorus::launch
