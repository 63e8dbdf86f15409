#include "chorus/core/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "chorus/core/error.h"
#include "launch/line_output.h"
#include "shm/waiter.h"

extern char** environ;

namespace chorus {

using detail::concat;

std::string signal_name(int signal) {
  if (const char* abbrev = sigabbrev_np(signal)) return concat("SIG", abbrev);
  return concat("signal ", signal);
}

std::vector<std::pair<std::string, std::string>> worker_thread_environment(int nproc) {
  std::vector<std::pair<std::string, std::string>> env;
  if (nproc <= 1) return env;
  const auto unset = [](const char* name) { return std::getenv(name) == nullptr; };
  if (unset("OMP_NUM_THREADS")) env.emplace_back("OMP_NUM_THREADS", "1");
  if (unset("OMP_WAIT_POLICY") && unset("GOMP_SPINCOUNT") && unset("KMP_BLOCKTIME"))
    env.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
  return env;
}

namespace {
bool binds() {
  const std::string v = shm::bind_to();
  if (v == "none") return false;
  if (v == "cores" || v == "core" || v.empty()) return true;
  throw InvalidArgument(concat("CHORUS_BIND_TO=", v, ": expected cores (each worker its own CPUs) or none"));
}
}  // namespace

std::vector<int> worker_cpus(int local, int nproc) {
  const std::vector<int> cpus = shm::usable_cpus();
  if (!binds() || nproc <= 1 || size_t(nproc) > cpus.size()) return {};
  const size_t share = cpus.size() / size_t(nproc);
  return {cpus.begin() + ptrdiff_t(size_t(local) * share), cpus.begin() + ptrdiff_t(size_t(local + 1) * share)};
}

std::string describe_binding(int nproc, const std::string& unbind) {
  const size_t share = worker_cpus(0, nproc).size();
  if (share == 0) return "";
  return concat("binding each of the ", nproc, " workers to ",
                share == 1 ? std::string("a CPU") : concat(share, " CPUs"), " of its own (", shm::usable_cpus().size(),
                " here); ", unbind, " leaves them unbound");
}

std::vector<std::pair<std::string, std::string>> launcher_environment(const Environment& p, int max_restarts) {
  const auto s = [](auto v) { return concat(v); };
  return {
      {"RANK", s(p.rank)},
      {"LOCAL_RANK", s(p.local_rank)},
      {"WORLD_SIZE", s(p.world_size)},
      {"LOCAL_WORLD_SIZE", s(p.local_world_size)},
      {"GROUP_RANK", s(p.node_rank)},
      {"NODE_RANK", s(p.node_rank)},
      {"GROUP_WORLD_SIZE", s(p.num_nodes)},
      {"ROLE_RANK", s(p.rank)},
      {"ROLE_NAME", "default"},
      {"ROLE_WORLD_SIZE", s(p.world_size)},
      {"MASTER_ADDR", p.master_addr},
      {"MASTER_PORT", s(p.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", s(p.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", s(max_restarts)},
      {"TORCHELASTIC_RUN_ID", p.job_id},
      {"CHORUS_LAUNCHER", "chorusrun"},
      {"CHORUS_RANK", s(p.rank)},
      {"CHORUS_LOCAL_RANK", s(p.local_rank)},
      {"CHORUS_WORLD_SIZE", s(p.world_size)},
      {"CHORUS_LOCAL_WORLD_SIZE", s(p.local_world_size)},
      {"CHORUS_NODE_RANK", s(p.node_rank)},
      {"CHORUS_STORE_ADDR", p.master_addr},
      {"CHORUS_STORE_PORT", s(p.master_port)},
      {"CHORUS_RESTART_COUNT", s(p.restart_count)},
      {"CHORUS_RUN_ID", p.job_id},
  };
}

std::string WorkerExit::describe() const {
  const std::string who = concat("rank ", rank, " (pid ", pid, ")");
  if (signal) return concat(who, " was killed by ", signal_name(signal));
  return concat(who, " exited with code ", exit_code);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Worker {
  int rank = 0;
  pid_t pid = 0;
  int pidfd = -1;
  bool running = false;
  int out = -1, err = -1;  // read ends of its stdout/stderr pipes, -1 once closed
  std::unique_ptr<launch::LineOutput> out_lines, err_lines;
  FILE* log = nullptr;
  WorkerExit exit;
};

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// The child's side of start(): never returns.
[[noreturn]] void become_worker(const WorkerSpec& spec, pid_t parent, int out, int err, int status_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) signal(s, SIG_DFL);
  if (out >= 0) dup2(out, STDOUT_FILENO);
  if (err >= 0) dup2(err, STDERR_FILENO);
  for (const auto& [k, v] : spec.env) setenv(k.c_str(), v.c_str(), 1);
  if (!spec.cpus.empty()) {  // Note [A core for every rank]; where it fails the worker runs unbound
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : spec.cpus) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int e = errno;
  (void)!write(status_fd, &e, sizeof(e));
  _exit(127);
}

}  // namespace

struct Supervisor::State {
  SupervisorOptions options;
  std::vector<Worker> workers;
  std::vector<WorkerExit> failures;
  std::vector<pid_t> all_pids;  // every worker ever started, for the shared-memory sweep

  void read_pipe(Worker& w, int& fd, launch::LineOutput& lines) {
    char buf[65536];
    for (;;) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        lines.feed(buf, size_t(n));
        if (size_t(n) < sizeof(buf)) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      lines.finish();  // EOF or error: the worker closed its end
      close_fd(fd);
      (void)w;
      return;
    }
  }

  // Reaps w if it has exited; true when it did.
  bool reap(Worker& w, bool block) {
    if (!w.running) return false;
    int status = 0;
    pid_t got = waitpid(w.pid, &status, block ? 0 : WNOHANG);
    if (got != w.pid) return false;
    w.running = false;
    close_fd(w.pidfd);
    w.exit.rank = w.rank;
    w.exit.pid = w.pid;
    if (WIFSIGNALED(status))
      w.exit.signal = WTERMSIG(status);
    else
      w.exit.exit_code = WEXITSTATUS(status);
    return true;
  }

  // Forwards output until the pipes close or `until` passes.
  void drain(Clock::time_point until) {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<std::pair<Worker*, int*>> owners;
      for (auto& w : workers)
        for (int* fd : {&w.out, &w.err})
          if (*fd >= 0) {
            fds.push_back({*fd, POLLIN, 0});
            owners.emplace_back(&w, fd);
          }
      if (fds.empty()) return;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return;
      if (poll(fds.data(), fds.size(), int(left)) <= 0) return;
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents) {
          auto& [w, fd] = owners[i];
          read_pipe(*w, *fd, fd == &w->out ? *w->out_lines : *w->err_lines);
        }
    }
  }

  void sweep_shared_memory() {
    DIR* d = opendir("/dev/shm");
    if (!d) return;
    std::vector<std::string> doomed;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      for (pid_t pid : all_pids)
        if (name.rfind(concat("chorus-", pid, "-"), 0) == 0) doomed.push_back(name);
    }
    closedir(d);
    for (const auto& name : doomed) unlink(("/dev/shm/" + name).c_str());
  }
};

Supervisor::Supervisor(SupervisorOptions options) : s_(std::make_unique<State>()) { s_->options = std::move(options); }

Supervisor::~Supervisor() {
  stop();
  for (auto& w : s_->workers) {
    close_fd(w.out);
    close_fd(w.err);
    if (w.log) std::fclose(w.log);
  }
}

std::vector<int> Supervisor::pids() const {
  std::vector<int> out;
  for (const auto& w : s_->workers) out.push_back(w.pid);
  return out;
}

void Supervisor::start(const std::vector<WorkerSpec>& specs) {
  stop();
  for (auto& w : s_->workers) {
    close_fd(w.out);
    close_fd(w.err);
    if (w.log) std::fclose(w.log);
  }
  s_->workers.clear();
  const SupervisorOptions& o = s_->options;
  const pid_t parent = getpid();
  for (const auto& spec : specs) {
    if (spec.argv.empty()) throw InvalidArgument(concat(o.name, ": rank ", spec.rank, " has no program to run"));
    Worker w;
    w.rank = spec.rank;
    int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
    if (pipe2(status, O_CLOEXEC) != 0 ||
        (o.capture_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)))
      throw Error(concat(o.name, ": cannot create pipes for rank ", spec.rank, ": ", std::strerror(errno)));
    if (!o.log_dir.empty()) {
      const std::string path = concat(o.log_dir, "/rank_", spec.rank, ".log");
      w.log = std::fopen(path.c_str(), "a");
      if (!w.log) throw Error(concat(o.name, ": cannot write ", path, ": ", std::strerror(errno)));
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw Error(concat(o.name, ": fork failed for rank ", spec.rank, ": ", std::strerror(errno)));
    if (pid == 0) become_worker(spec, parent, out[1], err[1], status[1]);
    setpgid(pid, pid);
    close(status[1]);
    for (int fd : {out[1], err[1]})
      if (fd >= 0) close(fd);
    w.pid = pid;
    w.running = true;
    s_->all_pids.push_back(pid);
#ifdef SYS_pidfd_open
    w.pidfd = int(syscall(SYS_pidfd_open, pid, 0));
#endif
    w.out = out[0];
    w.err = err[0];
    for (int fd : {w.out, w.err})
      if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const std::string prefix = o.prefix ? concat("[rank ", spec.rank, "] ") : "";
    w.out_lines = std::make_unique<launch::LineOutput>(STDOUT_FILENO, prefix, w.log);
    w.err_lines = std::make_unique<launch::LineOutput>(STDERR_FILENO, prefix, w.log);
    int exec_errno = 0;
    ssize_t n;
    do n = read(status[0], &exec_errno, sizeof(exec_errno));
    while (n < 0 && errno == EINTR);
    close(status[0]);
    s_->workers.push_back(std::move(w));
    if (n > 0) {
      stop();
      throw Error(
          concat(o.name, ": cannot start rank ", spec.rank, ": '", spec.argv[0], "': ", std::strerror(exec_errno)));
    }
  }
}

const std::vector<WorkerExit>& Supervisor::failures() const { return s_->failures; }

std::string Supervisor::describe_failures() const {
  std::string out;
  for (const auto& f : s_->failures) out += (out.empty() ? "" : "; ") + f.describe();
  return out;
}

// After a first failure: collects the workers that also fail within a moment, forwarding output.
void Supervisor::settle() {
  const auto until = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < until) {
    bool running = false;
    for (auto& w : s_->workers) {
      if (s_->reap(w, false) && !w.exit.ok()) s_->failures.push_back(w.exit);
      running = running || w.running;
    }
    if (!running) return;
    s_->drain(Clock::now() + std::chrono::milliseconds(10));
    if (!s_->options.capture_output) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<WorkerExit> Supervisor::wait(int interrupt_fd, const std::function<WaitCheck()>& check) {
  auto& workers = s_->workers;
  s_->failures.clear();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, int>> owners;  // kind: 0 out, 1 err, 2 pidfd, 3 interrupt
    for (auto& w : workers) {
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0}), owners.emplace_back(&w, 0);
      if (w.err >= 0) fds.push_back({w.err, POLLIN, 0}), owners.emplace_back(&w, 1);
      if (w.running && w.pidfd >= 0) fds.push_back({w.pidfd, POLLIN, 0}), owners.emplace_back(&w, 2);
    }
    if (interrupt_fd >= 0) fds.push_back({interrupt_fd, POLLIN, 0}), owners.emplace_back(nullptr, 3);
    bool any_running = false;
    for (auto& w : workers) any_running = any_running || w.running;
    if (!any_running) {
      s_->drain(Clock::now() + std::chrono::seconds(1));
      s_->sweep_shared_memory();
      return std::nullopt;
    }
    // Without pidfds (old kernels) poll with a timeout and reap by polling.
    int ready = poll(fds.data(), fds.size(), 100);
    if (const WaitCheck wanted = check ? check() : WaitCheck::Continue; wanted != WaitCheck::Continue) {
      if (wanted == WaitCheck::Stop) stop();
      WorkerExit out;
      out.rank = wanted == WaitCheck::Stop ? WorkerExit::kStopped : WorkerExit::kPaused;
      return out;
    }
    if (ready < 0 && errno != EINTR) throw Error(concat(s_->options.name, ": poll failed: ", std::strerror(errno)));
    std::vector<Worker*> exited;
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto [w, kind] = owners[i];
      if (kind == 3) {
        stop();
        WorkerExit interrupted;
        return interrupted;
      }
      if (kind == 0) s_->read_pipe(*w, w->out, *w->out_lines);
      if (kind == 1) s_->read_pipe(*w, w->err, *w->err_lines);
      if (kind == 2) exited.push_back(w);
    }
    // Only the workers whose exit this round announced (without pidfds: any), so that the first
    // to fail is the one named, not a peer that failed because of it a moment later.
    for (auto& w : workers)
      if (w.running && w.pidfd < 0) exited.push_back(&w);
    for (Worker* w : exited) {
      if (!s_->reap(*w, false) || w->exit.ok()) continue;
      s_->failures.push_back(w->exit);
      settle();
      stop();
      return s_->failures.front();
    }
  }
}

void Supervisor::stop() {
  auto& workers = s_->workers;
  bool any = false;
  for (auto& w : workers)
    if (w.running) {
      kill(-w.pid, SIGTERM);
      kill(w.pid, SIGTERM);
      any = true;
    }
  if (any) {
    const auto deadline = Clock::now() + s_->options.grace;
    for (;;) {
      bool left = false;
      for (auto& w : workers) left = !s_->reap(w, false) && w.running ? true : left;
      if (!left) break;
      if (Clock::now() >= deadline) {
        for (auto& w : workers)
          if (w.running) {
            kill(-w.pid, SIGKILL);
            kill(w.pid, SIGKILL);
          }
        for (auto& w : workers) s_->reap(w, true);
        break;
      }
      s_->drain(Clock::now() + std::chrono::milliseconds(10));
      if (!s_->options.capture_output) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  s_->drain(Clock::now() + std::chrono::milliseconds(200));
  s_->sweep_shared_memory();
}

}  // namespace chorus
