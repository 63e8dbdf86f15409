// The ordering side of the Communicator: the executor thread of async collectives, and the
// per-(peer, direction) tickets that keep sends and receives in issue order.
#include <algorithm>

#include "call.h"
#include "chorus/core/communicator.h"

namespace chorus {

uint64_t Communicator::take_ticket(bool send, int peer) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  if (p2p_issued_.empty()) {
    p2p_issued_.assign(2 * size_t(size_), 0);
    p2p_done_.assign(2 * size_t(size_), 0);
  }
  const size_t channel = size_t(send) * size_t(size_) + size_t(std::clamp(peer, 0, size_ - 1));
  return p2p_issued_[channel]++;
}

void Communicator::run_p2p(Call& call, Timeout timeout, uint64_t ticket) {
  const size_t channel = size_t(call.kind == OpKind::Send) * size_t(size_) + size_t(std::clamp(call.root, 0, size_ - 1));
  {
    std::unique_lock<std::mutex> lock(p2p_mu_);
    p2p_cv_.wait(lock, [&] { return p2p_done_[channel] == ticket; });
  }
  struct Turn {  // the next ticket may go once this one is done, whatever happened
    Communicator* self;
    size_t channel;
    ~Turn() {
      {
        std::lock_guard<std::mutex> lock(self->p2p_mu_);
        ++self->p2p_done_[channel];
      }
      self->p2p_cv_.notify_all();
    }
  } turn{this, channel};
  execute(call, timeout);
}

std::shared_ptr<Work> Communicator::submit(std::function<void()> fn) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
    queue_.emplace_back(std::move(fn), work);
    ++busy_;
  }
  queue_cv_.notify_all();
  return work;
}

void Communicator::executor_loop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [fn, work] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
    lock.lock();
    --busy_;
    queue_cv_.notify_all();
  }
}

void Communicator::drain() {
  if (busy_.load(std::memory_order_acquire) == 0) return;
  if (std::this_thread::get_id() == executor_.get_id()) return;
  std::unique_lock<std::mutex> lock(queue_mu_);
  queue_cv_.wait(lock, [&] { return busy_ == 0; });
}

std::shared_ptr<Work> Communicator::all_reduce_async(const void* in, void* out, size_t count, DataType dtype,
                                                     ReduceOp op, Timeout timeout) {
  return submit([=, this] { all_reduce(in, out, count, dtype, op, timeout); });
}
std::shared_ptr<Work> Communicator::broadcast_async(void* buf, size_t count, DataType dtype, int root, Timeout timeout) {
  return submit([=, this] { broadcast(buf, count, dtype, root, timeout); });
}
std::shared_ptr<Work> Communicator::reduce_async(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                                                 int root, Timeout timeout) {
  return submit([=, this] { reduce(in, out, count, dtype, op, root, timeout); });
}
std::shared_ptr<Work> Communicator::all_gather_async(const void* in, void* out, size_t count, DataType dtype,
                                                     Timeout timeout) {
  return submit([=, this] { all_gather(in, out, count, dtype, timeout); });
}
std::shared_ptr<Work> Communicator::all_gather_v_async(const void* in, void* out, std::vector<size_t> counts,
                                                       DataType dtype, Timeout timeout) {
  return submit([=, this] { all_gather_v(in, out, counts, dtype, timeout); });
}
std::shared_ptr<Work> Communicator::gather_async(const void* in, void* out, size_t count, DataType dtype, int root,
                                                 Timeout timeout) {
  return submit([=, this] { gather(in, out, count, dtype, root, timeout); });
}
std::shared_ptr<Work> Communicator::gather_v_async(const void* in, void* out, std::vector<size_t> counts,
                                                   DataType dtype, int root, Timeout timeout) {
  return submit([=, this] { gather_v(in, out, counts, dtype, root, timeout); });
}
std::shared_ptr<Work> Communicator::scatter_async(const void* in, void* out, size_t count, DataType dtype, int root,
                                                  Timeout timeout) {
  return submit([=, this] { scatter(in, out, count, dtype, root, timeout); });
}
std::shared_ptr<Work> Communicator::reduce_scatter_async(const void* in, void* out, size_t count, DataType dtype,
                                                         ReduceOp op, Timeout timeout) {
  return submit([=, this] { reduce_scatter(in, out, count, dtype, op, timeout); });
}
std::shared_ptr<Work> Communicator::all_to_all_async(const void* in, void* out, size_t count, DataType dtype,
                                                     Timeout timeout) {
  return submit([=, this] { all_to_all(in, out, count, dtype, timeout); });
}
std::shared_ptr<Work> Communicator::all_to_all_v_async(const void* in, std::vector<size_t> send_counts, void* out,
                                                       std::vector<size_t> recv_counts, DataType dtype,
                                                       Timeout timeout) {
  return submit([=, this] { all_to_all_v(in, send_counts, out, recv_counts, dtype, timeout); });
}
std::shared_ptr<Work> Communicator::submit_p2p(Call call, Timeout timeout) {
  auto work = std::make_shared<Work>();
  const uint64_t ticket = take_ticket(call.kind == OpKind::Send, call.root);
  std::lock_guard<std::mutex> lock(p2p_mu_);
  // Reap the threads of finished transfers.
  std::erase_if(p2p_threads_, [](auto& entry) {
    if (!entry.second->is_completed()) return false;
    entry.first.join();
    return true;
  });
  std::thread t([this, call, timeout, ticket, work]() mutable {
    std::exception_ptr error;
    try {
      run_p2p(call, timeout, ticket);
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
  });
  p2p_threads_.emplace_back(std::move(t), work);
  return work;
}

std::shared_ptr<Work> Communicator::send_async(const void* buf, size_t count, DataType dtype, int dst, int tag,
                                               Timeout timeout) {
  return submit_p2p(make_send(buf, count, dtype, dst, tag), timeout);
}
std::shared_ptr<Work> Communicator::recv_async(void* buf, size_t count, DataType dtype, int src, int tag,
                                               Timeout timeout) {
  return submit_p2p(make_recv(buf, count, dtype, src, tag), timeout);
}
std::shared_ptr<Work> Communicator::barrier_async(Timeout timeout) {
  return submit([=, this] { barrier(timeout); });
}

}  // namespace chorus
