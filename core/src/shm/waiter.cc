#include "shm/waiter.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "chorus/core/settings.h"

namespace chorus::shm {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{};
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

namespace {
bool global_barriers() {  // whether this kernel offers MEMBARRIER_CMD_GLOBAL_EXPEDITED
  static const bool offered = [] {
    const long commands = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return commands > 0 && (commands & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0;
  }();
  return offered;
}
}  // namespace

bool asymmetric_fences() {
  // Registered again for every group: registration belongs to the address space, and a child
  // forked after a group was made has a new one.
  return global_barriers() && syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
}

void sleeper_fence() {
  // Where the kernel has no such barrier, no group posts lightly: the seq_cst count is the fence.
  if (global_barriers()) syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::thread::hardware_concurrency());
}

std::vector<int> usable_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string usable_cpu_list() {
  const std::vector<int> cpus = usable_cpus();
  std::string list;
  for (size_t i = 0; i < cpus.size(); ++i) {
    size_t last = i;  // the end of the run of consecutive CPUs from cpus[i]
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    if (!list.empty()) list += ',';
    list += std::to_string(cpus[i]);
    if (last > i) list.append("-").append(std::to_string(cpus[last]));
    i = last;
  }
  return list;
}

std::vector<int> parse_cpu_list(const std::string& list) {
  std::vector<int> cpus;
  size_t at = 0;
  while (at < list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string range = list.substr(at, end - at);
    const size_t dash = range.find('-');
    try {  // "N" or "N-M"; anything else adds nothing
      if (!range.empty() && std::isdigit(static_cast<unsigned char>(range[0]))) {
        const int first = std::stoi(range),
                  last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
        for (int c = first; c <= last && c < CPU_SETSIZE; ++c) cpus.push_back(c);
      }
    } catch (const std::exception&) {
    }
    at = end + 1;
  }
  return cpus;
}

namespace {
std::atomic<int> ranks_sharing_cores{0}, cpus_of_sharing_ranks{0};

void note_most(std::atomic<int>& most, int value) {
  int seen = most.load();
  while (value > seen && !most.compare_exchange_weak(seen, value)) {
  }
}
}  // namespace

void note_ranks_sharing_cores(int ranks, int cpus) {
  note_most(ranks_sharing_cores, ranks);
  note_most(cpus_of_sharing_ranks, cpus);
}

std::string bind_to() {
  const char* to = std::getenv("CHORUS_BIND_TO");
  return to ? to : "cores";
}

namespace {
std::atomic<bool> was_placed{false};  // Note [Keeping the ranks even]
}  // namespace

int move_onto(int cpu) {
  cpu_set_t mine, one;
  if (cpu < 0 || sched_getaffinity(0, sizeof(mine), &mine) != 0 || CPU_COUNT(&mine) < 2 || !CPU_ISSET(cpu, &mine))
    return -1;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) return -1;
  return sched_setaffinity(0, sizeof(mine), &mine) == 0 ? cpu : -1;  // the CPUs it had, from where it is now
}

int share_of_cpus(const std::vector<int>& cpus, int index, int ranks) {
  if (cpus.empty() || ranks < 1 || index < 0 || index >= ranks) return -1;
  return cpus[size_t(index) * cpus.size() / size_t(ranks)];
}

int place_in_blocks(int index, int ranks) {
  if (bind_to() == "none") return -1;
  const std::vector<int> cpus = usable_cpus();
  return cpus.size() < 2 ? -1 : move_onto(share_of_cpus(cpus, index, ranks));
}

void place_once(int index, int ranks) {
  static std::once_flag placed;
  std::call_once(placed, [index, ranks] { was_placed.store(place_in_blocks(index, ranks) >= 0); });
}

bool placed() { return was_placed.load(std::memory_order_relaxed); }

int runnable_now() {
  // /proc/loadavg: "0.52 0.58 0.59 3/412 12345", the fourth field runnable/all.
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[128];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  int runnable = -1, all = 0;
  return std::sscanf(text, "%*f %*f %*f %d/%d", &runnable, &all) == 2 ? runnable : -1;
}

int job_cores() { return std::max(usable_cores(), cpus_of_sharing_ranks.load()); }

SpinPolicy SpinPolicy::for_group(int size) {
  SpinPolicy p;
  const int sharing = ranks_sharing_cores.load();
  const bool oversubscribed = std::max(size, sharing) > job_cores();
  const bool bound = !oversubscribed && usable_cores() < job_cores();  // Note [Spinning on a core of one's own]
  p.spin_for = std::chrono::microseconds(settings().shm_spin_us.value_or(bound ? 2000 : 50));
  p.crowded = oversubscribed;
  p.spin_alone = size >= sharing;
  if (oversubscribed) p.yield_for = kCrowdedYield;
  return p;
}

SpinPolicy SpinPolicy::to_even_out() const {
  SpinPolicy p = *this;
  if (crowded) p.yield_for = kEvenOutYield;
  return p;
}

}  // namespace chorus::shm
