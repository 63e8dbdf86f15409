#include "launch/line_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace chorus::launch {

void LineOutput::feed(const char* data, size_t n) {
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != '\n') continue;
    if (pending_.empty()) {
      emit(data + start, i - start);
    } else {
      pending_.append(data + start, i - start);
      emit(pending_.data(), pending_.size());
      pending_.clear();
    }
    start = i + 1;
  }
  pending_.append(data + start, n - start);
}

void LineOutput::finish() {
  if (pending_.empty()) return;
  emit(pending_.data(), pending_.size());
  pending_.clear();
}

void LineOutput::emit(const char* line, size_t n) {
  std::string out;
  out.reserve(prefix_.size() + n + 1);
  out += prefix_;
  out.append(line, n);
  out += '\n';
  size_t done = 0;
  while (done < out.size()) {
    ssize_t w = ::write(to_fd_, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // our own output is gone (closed pipe): keep supervising regardless
    done += size_t(w);
  }
  if (log_) {
    std::fwrite(line, 1, n, log_);
    std::fputc('\n', log_);
    std::fflush(log_);
  }
}

}  // namespace chorus::launch
