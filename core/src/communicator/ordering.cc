// The executor of submitted collectives and the tickets of point-to-point calls (Note [Call order]).
#include "communicator/ordering.h"

#include <algorithm>
#include <utility>

namespace chorus {

namespace {
thread_local const CallOrder* t_running_body = nullptr;  // whose submitted body this thread runs
}

CallOrder::~CallOrder() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  {
    std::lock_guard<std::recursive_mutex> lock(anchor_->mu);  // a waiter's body first
    anchor_->order = nullptr;
  }
  for (auto& [t, work] : transfers_) t.join();
}

std::shared_ptr<Work> CallOrder::submit(std::function<void()> body) {
  auto work = std::make_shared<Work>();
  work->set_runner([anchor = anchor_, raw = work.get()] {  // before anyone can run or wait for it
    std::lock_guard<std::recursive_mutex> lock(anchor->mu);
    return anchor->order && anchor->order->run_here(raw);
  });
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
    queue_.emplace_back(std::move(body), work);
    ++busy_;
  }
  queue_cv_.notify_all();
  return work;
}

void CallOrder::run_body(std::function<void()>& body, Work& work) {
  const CallOrder* outer = std::exchange(t_running_body, this);
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  body = nullptr;  // release what it holds before anyone learns it finished
  work.finish(error);
  t_running_body = outer;
}

void CallOrder::executor_loop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    queue_cv_.wait(lock, [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
    if (queue_.empty()) return;
    run_front(lock);
  }
}

bool CallOrder::run_here(const Work* work) {
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (running_ || queue_.empty() || queue_.front().second.get() != work || t_running_body == this) return false;
  run_front(lock);
  return true;
}

void CallOrder::run_front(std::unique_lock<std::mutex>& lock) {
  auto [body, work] = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  lock.unlock();
  run_body(body, *work);
  lock.lock();
  running_ = false;
  --busy_;
  queue_cv_.notify_all();
}

void CallOrder::wait_idle() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (t_running_body == this) return;
  queue_cv_.wait(lock, [&] { return busy_ == 0; });
}

size_t CallOrder::channel(const Call& c) const {
  return size_t(c.kind == OpKind::Send) * size_t(size_) + size_t(std::clamp(c.root, 0, size_ - 1));
}

uint64_t CallOrder::take_ticket(const Call& c) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (issued_.empty()) {
    issued_.assign(2 * size_t(size_), 0);
    done_.assign(2 * size_t(size_), 0);
  }
  return issued_[channel(c)]++;
}

void CallOrder::wait_turn(size_t channel, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(p2p_mu_);
  p2p_cv_.wait(lock, [&] { return done_[channel] == ticket; });
}

void CallOrder::pass_turn(size_t channel) {
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    ++done_[channel];
  }
  p2p_cv_.notify_all();
}

std::shared_ptr<Work> CallOrder::in_turn_async(const Call& c, std::function<void()> move) {
  auto work = std::make_shared<Work>();
  const uint64_t ticket = take_ticket(c);
  std::lock_guard<std::mutex> lock(p2p_mu_);
  std::erase_if(transfers_, [](auto& entry) {  // reap the threads of finished transfers
    if (!entry.second->is_completed()) return false;
    entry.first.join();
    return true;
  });
  std::thread t([this, c, ticket, work, move = std::move(move)] {
    std::exception_ptr error;
    try {
      in_turn(c, ticket, move);
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
  });
  transfers_.emplace_back(std::move(t), work);
  return work;
}

}  // namespace chorus
