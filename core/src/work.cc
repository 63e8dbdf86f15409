#include "chorus/core/work.h"

#include "chorus/core/error.h"

namespace chorus {

void Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (!timeout) run_here();  // a timed wait must be able to return while the operation goes on
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout) {
    if (!cv_.wait_for(lock, *timeout, [&] { return done_; }))
      throw TimeoutError(detail::concat("Work::wait: the operation did not finish within ", timeout->count(), " ms"),
                         {}, "Work::wait");
  } else {
    cv_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Work::on_finish(std::function<void(std::exception_ptr)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    callbacks_.push_back(std::move(fn));
    return;
  }
  auto error = error_;
  lock.unlock();
  fn(error);
}

// The callbacks run before the work counts as done, so that a thread returning from wait() finds
// them run (a handle's bookkeeping, a future completed); one added while they run runs too. They
// may not wait on this Work (on_finish), so nothing waits for done_ here.
void Work::finish(std::exception_ptr error) {
  std::unique_lock<std::mutex> lock(mu_);
  runner_ = nullptr;
  while (!callbacks_.empty()) {
    std::vector<std::function<void(std::exception_ptr)>> callbacks;
    callbacks.swap(callbacks_);
    lock.unlock();
    for (auto& fn : callbacks) fn(error);
    lock.lock();
  }
  done_ = true;
  error_ = error;
  lock.unlock();
  cv_.notify_all();
}

void Work::set_runner(std::function<bool()> runner) {
  std::lock_guard<std::mutex> lock(mu_);
  runner_ = std::move(runner);
}

bool Work::run_here() {
  std::function<bool()> runner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || !runner_) return false;
    runner = runner_;
  }
  return runner();
}

}  // namespace chorus
