#include "shm/peer_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace chorus::shm {

PeerWatch::~PeerWatch() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

void PeerWatch::watch(int rank, int pid) {
  if (int(pids_.size()) <= rank) {
    pids_.resize(size_t(rank) + 1, 0);
    fds_.resize(size_t(rank) + 1, -1);
  }
  pids_[size_t(rank)] = pid;
#ifdef SYS_pidfd_open
  if (pid > 0) fds_[size_t(rank)] = int(syscall(SYS_pidfd_open, pid, 0));
#endif
}

bool PeerWatch::alive(int rank) const {
  if (rank >= int(pids_.size()) || pids_[size_t(rank)] <= 0) return true;
  if (int fd = fds_[size_t(rank)]; fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;  // readable once the process has exited
  }
  const int pid = pids_[size_t(rank)];
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  if (FILE* f = std::fopen(path, "r")) {
    int got_pid = 0;
    char comm[256], state = 0;
    int n = std::fscanf(f, "%d %255s %c", &got_pid, comm, &state);
    std::fclose(f);
    if (n == 3 && (state == 'Z' || state == 'X')) return false;
  }
  return true;
}

}  // namespace chorus::shm
