// The handle of an asynchronous operation (modeled on c10d's Work).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace chorus {

class Work {
 public:
  // Blocks until the operation finished, then rethrows its error if it failed. With a timeout,
  // throws TimeoutError if it has not finished by then (the operation itself goes on).
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Non-blocking: has the operation finished (successfully or not)?
  bool is_completed() const;
  // Non-blocking: finished without error.
  bool is_success() const;
  // Non-blocking: the operation's error, or null while it runs or when it succeeded.
  std::exception_ptr exception() const;

  // Runs fn(error) once the operation finishes: on the finishing thread, or at once on this
  // thread when it already has. fn must not throw, block, or wait on this Work.
  void on_finish(std::function<void(std::exception_ptr)> fn);

  // For the executor: marks the operation finished, then runs the on_finish callbacks.
  // Thread-safe; wakes waiters.
  void finish(std::exception_ptr error);
  // For the executor (Note [Running on the waiter]): `runner` runs the operation on the calling
  // thread if it has not started yet and nothing must run before it, and says whether it did.
  // wait() without a timeout tries it first.
  void set_runner(std::function<bool()> runner);
  // Runs the operation on this thread through its runner, if it has one that can; true if it did.
  bool run_here();

  virtual ~Work() = default;

 private:
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
  std::function<bool()> runner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace chorus
