// The c10d Works of chorus's backend: how a finished chorus call completes torch's future, and
// how chorus's threads let go of Python's tensors when the interpreter exits.
//
// Note [Completing futures]
// c10d's futures run their .then() callbacks on the thread that completes them, and DDP comm hooks
// (PowerSGD) issue and wait for further collectives inside those callbacks. chorus finishes work
// on its executor thread, which must never block, so a finished chorus work only hands its
// completion to a pool of completer threads; the pool grows when every completer is busy (a
// callback waiting on another collective), so a completion never waits behind the callback
// that waits for it. A thread that waits for the work (Work::wait, the common synchronous call)
// completes the future itself as soon as chorus's work finished, whichever comes first; when a
// thread waits without a timeout, no completer is woken at all.
#include "work.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <chorus/core/error.h>

namespace chorus::python {

namespace {

// Note [Exiting Python]: a thread of chorus's (a completer, the executor, a transfer) may drop the
// last reference to a ChorusWork, and with it to tensors Python made, whose release takes the GIL.
// Once the interpreter is finalizing, a thread that asks for the GIL is ended by pthread_exit,
// whose unwinding through a destructor aborts the process ("terminate called without an active
// exception"; seen in 1 of 30 spawned children that exit with a group open). So every reference
// chorus's threads hold is counted (`held`), and an atexit hook (exiting(), registered by the
// package) first waits, with the GIL released, until they are all dropped; what is still held
// after that (a call stuck on a dead peer) is leaked, not released, by the threads that hold it.
struct Held {
  std::atomic<int> count{0};
  std::atomic<bool> exiting{false};
};
Held& held() {
  static Held* h = new Held;  // never destroyed: threads may use it during static destruction
  return *h;
}

class Completer {
 public:
  static Completer& get() {
    static Completer* c = new Completer;  // never destroyed: its threads outlive static destructors
    return *c;
  }
  void post(std::function<void()> fn) {
    held().count.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(fn));
    if (idle_ == 0) {
      ++threads_;
      std::thread([this] { loop(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !tasks_.empty(); });
      --idle_;
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      if (held().exiting.load())
        new std::function<void()>(std::move(fn));  // Note [Exiting Python]: leaked, never released
      fn = nullptr;
      held().count.fetch_sub(1);
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0, threads_ = 0;
};

}  // namespace

ChorusWork::ChorusWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs, bool on_caller)
    : c10d::Work(rank, type, title),
      c10d_outputs_(std::move(outputs)),
      waiter_(on_caller),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
  on_finish([this](std::exception_ptr error) {
    if (!waiter_.load()) Completer::get().post([self = self(), error] { self->complete(error); });
  });
}

std::shared_ptr<chorus::TensorWork> ChorusWork::handle() {
  held().count.fetch_add(1);
  return std::shared_ptr<chorus::TensorWork>(this, [keep = self()](chorus::TensorWork*) mutable {
    if (held().exiting.load())
      keep.release();
    else
      keep.reset();
    held().count.fetch_sub(1);
  });
}

void ChorusWork::complete(std::exception_ptr error) {
  if (claimed_.exchange(true)) return;
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(c10d_outputs_));
}

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == ::kNoTimeout) waiter_ = true;  // it completes the future itself, below
  try {
    chorus::Work::wait(timeout == ::kNoTimeout ? std::nullopt : std::optional<std::chrono::milliseconds>(timeout));
    complete(nullptr);
  } catch (const TimeoutError&) {
    if (!is_completed()) throw;  // the deadline passed; the work goes on
    complete(chorus::Work::exception());
  } catch (...) {
    complete(std::current_exception());
  }
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

BlockWork::BlockWork(int rank, std::vector<c10::intrusive_ptr<ChorusWork>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED, "chorus:coalesced"),
      works_(std::move(works)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
  auto left = std::make_shared<std::atomic<size_t>>(works_.size());
  if (works_.empty()) future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  for (auto& w : works_)
    w->getFuture()->addCallback([left, future = future_, works = works_](c10::ivalue::Future&) {
      if (left->fetch_sub(1) != 1) return;
      std::vector<at::Tensor> all;
      for (const auto& w : works) {
        if (auto error = w->exception()) return future->setError(error);
        for (const at::Tensor& t : w->result()) all.push_back(t);
      }
      future->markCompleted(c10::IValue(all));
    });
}

bool BlockWork::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  future_->wait();
  return true;
}

void python_exiting(std::chrono::milliseconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  while (held().count.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  held().exiting.store(true);
}

}  // namespace chorus::python
