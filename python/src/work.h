// The c10d Works chorus's backend returns (work.cc): one per call, one per coalescing block.
#pragma once

#include <chorus/process_group.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <vector>

namespace chorus::python {

// Note [Exiting Python] (work.cc): waits up to `patience` until chorus's threads hold no
// reference that Python would have to release, then makes them leak what they still hold. The
// package calls it at exit, with the GIL released.
void python_exiting(std::chrono::milliseconds patience);

// The c10d Work of one call, and the call's queued item itself (Note [One Work per call]): c10d
// holds it through its reference count, chorus's executor through the shared_ptr of handle().
// Its future completes as Note [Completing futures] (work.cc) says.
class ChorusWork final : public c10d::Work, public chorus::TensorWork {
 public:
  // `on_caller`: the call returns finished (AsyncOptions::on_caller), and the calling thread
  // completes the future right after (complete()).
  ChorusWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs, bool on_caller);

  // What ProcessGroup queues and finishes: this object, kept alive by a c10d reference meanwhile
  // (counted and, once Python exits, leaked: Note [Exiting Python]).
  std::shared_ptr<chorus::TensorWork> handle();

  // Once, by whichever comes first: a completer thread, a thread waiting in wait() (which then
  // runs the future's callbacks itself, one thread hand-off sooner), or the caller of a call that
  // ran on its thread.
  void complete(std::exception_ptr error);

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  int sourceRank() const override { return source(); }
  std::vector<at::Tensor> result() override { return c10d_outputs_; }
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<ChorusWork> self() { return c10::intrusive_ptr<ChorusWork>::reclaim_copy(this); }

  std::vector<at::Tensor> c10d_outputs_;  // c10d's view: the tensors the call wrote
  std::atomic<bool> waiter_{false};       // a thread waits (or waited) for it itself: no completer needed
  std::atomic<bool> claimed_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work endCoalescing returns (Note [Coalescing blocks]): finished when every call of the
// block is; its error is the first call's error, in issue order.
class BlockWork final : public c10d::Work {
 public:
  BlockWork(int rank, std::vector<c10::intrusive_ptr<ChorusWork>> works);
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<c10::intrusive_ptr<ChorusWork>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace chorus::python
