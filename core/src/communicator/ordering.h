// Note [Call order]: the order in which a rank's calls reach its group.
//   - Collectives reach the backend one at a time (Communicator::call_lock_, Note [The call
//     lock]), in the order the rank issues them; every rank must issue the same order.
//   - Submitted collectives (Communicator::submit) run on one executor thread per communicator,
//     in submission order; a blocking collective from another thread first waits until every
//     submitted one has finished, so the two kinds never interleave differently on two ranks.
//   - Note [Running on the waiter]: a thread that waits (without a timeout) for a submitted
//     collective that is first in the queue while the executor is idle takes it out of the queue
//     and runs it itself; the executor starts nothing else meanwhile. The order stays the same,
//     and `dist.all_reduce(t)` from Python, a submit followed at once by a wait, no longer pays
//     for waking the executor and being woken by it: 8-byte all_reduce 35 -> 4.5 us, barrier
//     22 -> 3.7 us at W=2 (gloo: 266 and 236 us in the same run). A submit that says it will be
//     waited for at once (AsyncOptions::on_caller) does not wake the executor at all: the
//     executor, woken and finding nothing to do, still cost a futex round trip per call.
//   - Sends and receives are ordered per (peer, direction): each takes a ticket when it is
//     issued and moves when the ticket before it is done, whatever thread it runs on. They do
//     not wait for collectives, nor for other peers.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "call.h"
#include "chorus/core/communicator.h"
#include "chorus/core/work.h"

namespace chorus {

class CallOrder {
 public:
  explicit CallOrder(int size) : size_(size) {}
  ~CallOrder();  // runs what was submitted, then joins the executor and the transfer threads

  // ---- collectives ----
  // Queues `body` to run on the executor thread after everything submitted before it (or on a
  // thread that waits for it, Note [Running on the waiter]). Returns async.handle (or a new
  // Work), which is the queued item itself and finishes when the body and async.then returned.
  std::shared_ptr<Work> submit(std::function<void()> body, AsyncOptions async = {});
  // Blocks until nothing submitted is queued or running. Returns at once on the executor thread
  // (a submitted body's own collectives must not wait for themselves).
  void drain() {
    if (busy_.load(std::memory_order_acquire) != 0) wait_idle();
  }

  // ---- point to point ----
  // The places of point-to-point call `c` in its (peer, direction) orders, taken when issued: one
  // (channel, ticket), or for a receive from any rank one on every incoming order.
  using Tickets = std::vector<std::pair<size_t, uint64_t>>;
  Tickets take_tickets(const Call& c);
  // Waits for the tickets' turns, runs `move`, then passes the turns on, whatever happened.
  template <class Move>
  void in_turn(const Tickets& tickets, Move&& move) {
    wait_turns(tickets);
    struct Turn {
      CallOrder* self;
      const Tickets& tickets;
      ~Turn() { self->pass_turns(tickets); }
    } turn{this, tickets};
    move();
  }
  // in_turn on a thread of its own: returns at once with the transfer's Work (async.handle, or a
  // new one), which finishes after `move` and async.then.
  std::shared_ptr<Work> in_turn_async(const Call& c, std::function<void()> move, AsyncOptions async = {});
  // Blocks until every transfer in_turn_async started so far has finished (each ends by its own
  // deadline at the latest); their errors stay in their Works.
  void wait_transfers();

 private:
  size_t channel(OpKind kind, int peer) const;
  void wait_turns(const Tickets& tickets);
  void pass_turns(const Tickets& tickets);
  void wait_idle();
  void executor_loop();
  // Runs `work`'s body on this thread if it is first in the queue and nothing runs; true if it did.
  bool run_here(const Work* work);
  // Runs the first queued body on this thread; `lock` holds queue_mu_, released meanwhile.
  void run_front(std::unique_lock<std::mutex>& lock);
  void start_executor();  // unless it runs; the caller holds queue_mu_
  void run_body(std::function<void()>& body, Work& work);

  // What a submitted Work's runner reaches: this CallOrder until its destructor has finished
  // everything (a waiter may call the runner after the Work finished).
  struct Anchor {
    explicit Anchor(CallOrder* o) : order(o) {}
    std::recursive_mutex mu;  // held while a waiter runs a body (and its on_finish callbacks)
    CallOrder* order;
  };
  std::shared_ptr<Anchor> anchor_ = std::make_shared<Anchor>(this);

  const int size_;
  std::mutex queue_mu_;
  std::condition_variable runnable_cv_;  // the executor: something to run, or stopping
  std::condition_variable idle_cv_;      // wait_idle(): nothing queued or running any more
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Work>>> queue_;
  std::atomic<size_t> busy_{0};  // queued + running
  bool running_ = false;         // a body runs, on the executor or on a waiter
  bool stopping_ = false;
  std::thread executor_;

  std::mutex p2p_mu_;
  std::condition_variable p2p_cv_;
  std::vector<uint64_t> issued_, done_;  // per (direction, peer): tickets taken / finished
  std::vector<std::pair<std::thread, std::shared_ptr<Work>>> transfers_;  // async sends/receives
};

}  // namespace chorus
