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
  runnable_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  {
    std::lock_guard<std::recursive_mutex> lock(anchor_->mu);  // a waiter's body first
    anchor_->order = nullptr;
  }
  for (auto& [t, work] : transfers_) t.join();
}

// Note [One Work per call]: the Work an asynchronous call returns is the item the executor
// queues, runs and finishes, not a wrapper around it: a layer above hands in its own subclass
// (AsyncOptions::handle), so a collective from Python costs one handle, finished once, and what
// must happen before it counts as done (a copy into the caller's tensor) runs as its `then`.
std::shared_ptr<Work> CallOrder::submit(std::function<void()> body, AsyncOptions async) {
  std::shared_ptr<Work> work = async.handle ? std::move(async.handle) : std::make_shared<Work>();
  if (async.then)
    body = [body = std::move(body), then = std::move(async.then)] {
      body();
      then();
    };
  work->set_runner([anchor = anchor_, raw = work.get()] {  // before anyone can run or wait for it
    std::lock_guard<std::recursive_mutex> lock(anchor->mu);
    return anchor->order && anchor->order->run_here(raw);
  });
  if (async.on_caller && t_running_body == this) {  // inside a body: runs as its blocking calls do
    run_body(body, *work);
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    // An on_caller call starts no executor (a new one would find it queued and run it at once);
    // run_front starts one when a call it ran leaves others queued.
    if (!async.on_caller) start_executor();
    queue_.emplace_back(std::move(body), work);
    ++busy_;
  }
  if (async.on_caller) {  // the executor is not woken for it: this thread runs it if it is next
    try {
      work->wait();
    } catch (...) {  // kept in the work for the caller
    }
    return work;
  }
  runnable_cv_.notify_all();
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

void CallOrder::start_executor() {
  if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
}

void CallOrder::executor_loop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    runnable_cv_.wait(lock, [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
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
  // Wake only who has something to do: waking an idle executor after every call a waiter ran
  // itself cost a futex round trip each (17% of a Python all_reduce's time on one rank).
  if (!queue_.empty()) start_executor();
  if (!queue_.empty() || stopping_) runnable_cv_.notify_all();
  if (busy_ == 0) idle_cv_.notify_all();
}

void CallOrder::wait_idle() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (t_running_body == this) return;
  idle_cv_.wait(lock, [&] { return busy_ == 0; });
}

size_t CallOrder::channel(OpKind kind, int peer) const {
  return size_t(kind == OpKind::Send) * size_t(size_) + size_t(std::clamp(peer, 0, size_ - 1));
}

CallOrder::Tickets CallOrder::take_tickets(const Call& c) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (issued_.empty()) {
    issued_.assign(2 * size_t(size_), 0);
    done_.assign(2 * size_t(size_), 0);
  }
  Tickets tickets;
  auto take = [&](int peer) {
    const size_t ch = channel(c.kind, peer);
    tickets.emplace_back(ch, issued_[ch]++);
  };
  if (c.kind != OpKind::RecvAny) {
    take(c.root);
  } else {
    for (int p = 0; p < size_; ++p) take(p);  // its own (unused) order too: harmless, and keeps this simple
  }
  return tickets;
}

void CallOrder::wait_turns(const Tickets& tickets) {
  std::unique_lock<std::mutex> lock(p2p_mu_);
  p2p_cv_.wait(lock, [&] {
    return std::all_of(tickets.begin(), tickets.end(), [&](const auto& t) { return done_[t.first] == t.second; });
  });
}

void CallOrder::pass_turns(const Tickets& tickets) {
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    for (const auto& t : tickets) ++done_[t.first];
  }
  p2p_cv_.notify_all();
}

std::shared_ptr<Work> CallOrder::in_turn_async(const Call& c, std::function<void()> move, AsyncOptions async) {
  std::shared_ptr<Work> work = async.handle ? std::move(async.handle) : std::make_shared<Work>();
  Tickets tickets = take_tickets(c);
  std::lock_guard<std::mutex> lock(p2p_mu_);
  std::erase_if(transfers_, [](auto& entry) {  // reap the threads of finished transfers
    if (!entry.second->is_completed()) return false;
    entry.first.join();
    return true;
  });
  std::thread t(
      [this, tickets = std::move(tickets), work, move = std::move(move), then = std::move(async.then)]() mutable {
        std::exception_ptr error;
        try {
          in_turn(tickets, move);
          if (then) then();
        } catch (...) {
          error = std::current_exception();
        }
        move = nullptr;  // release what they hold before anyone learns it finished
        then = nullptr;
        work->finish(error);
      });
  transfers_.emplace_back(std::move(t), work);
  return work;
}

void CallOrder::wait_transfers() {
  std::vector<std::shared_ptr<Work>> started;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    for (const auto& entry : transfers_) started.push_back(entry.second);
  }
  for (const auto& work : started) {
    try {
      work->wait();
    } catch (...) {  // the transfer's own error, which its Work keeps for whoever waits for it
    }
  }
}

}  // namespace chorus
