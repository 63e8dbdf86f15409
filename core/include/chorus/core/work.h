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

class CallOrder;

// The Work of an asynchronous call is also its place in the queue: the executor runs the call and
// finishes this very object (Note [One Work per call]). A layer above that needs more in its
// handle (results, a future) derives from Work and hands its object in (AsyncOptions::handle).
class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work() = default;

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

 private:
  friend class CallOrder;  // the executor: the only one that runs and finishes a Work
  // Runs the on_finish callbacks, then marks the operation finished. Thread-safe; wakes waiters.
  void finish(std::exception_ptr error);
  // Note [Running on the waiter]: `runner` runs the operation on the calling thread if it has not
  // started yet and nothing must run before it, and says whether it did. wait() without a
  // timeout tries it first.
  void set_runner(std::function<bool()> runner);
  // Runs the operation on this thread through its runner, if it has one that can; true if it did.
  bool run_here();

  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
  std::function<bool()> runner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace chorus
