#pragma once
// EventDispatcher: runs the consumers' event callbacks on a thread of its
// own, so the engine thread goes on to plan and launch its next step while
// the server parses, formats and queues the last step's tokens (the host's
// work overlapped with the device's, docs/architecture.md "Engine").
//
// Contract:
//  - Events of one request reach its callback in the order they were
//    posted, one at a time (one thread delivers every event).
//  - A callback that throws on a non-final event: the failure goes to the
//    FailureSink (the engine ends that request with an error), and every
//    later non-final event of that request is dropped; its final event is
//    still delivered (a consumer that throws again there is ignored).
//  - One producer thread: post() stages events, flush() hands the staged
//    ones over with one lock and one wake-up (a step's 64 events cost one
//    futex call, not 64).
//  - flush() blocks while `max_pending` or more events wait, so a consumer
//    slower than generation slows generation instead of growing memory
//    (the queue holds at most max_pending plus one flush's events).
//  - The destructor flushes and delivers every event posted before it, then
//    joins.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "rill/engine.h"

namespace rill {

class EventDispatcher {
 public:
  using FailureSink = std::function<void(uint64_t request_id, std::string message)>;

  EventDispatcher(FailureSink on_failure, size_t max_pending);
  ~EventDispatcher();
  EventDispatcher(const EventDispatcher&) = delete;
  EventDispatcher& operator=(const EventDispatcher&) = delete;

  // Stages `event` for request `id`'s callback (null: the event is dropped);
  // it is delivered after the next flush().
  void post(uint64_t id, std::shared_ptr<const EventCallback> callback, GenerationEvent&& event);
  // Hands every staged event to the dispatcher thread.
  void flush();

 private:
  struct Item {
    uint64_t id = 0;
    std::shared_ptr<const EventCallback> callback;
    GenerationEvent event;
  };
  void run();
  void deliver(Item& item);

  FailureSink on_failure_;
  const size_t max_pending_;
  std::mutex mu_;
  std::condition_variable ready_;  // the queue has items, or stop_
  std::condition_variable space_;  // the queue has room
  std::deque<Item> queue_;
  std::vector<Item> staged_;  // the producer's, between flushes
  bool stop_ = false;
  std::unordered_set<uint64_t> failed_;  // dispatcher thread only: consumers that threw, until their final event
  std::thread thread_;
};

}  // namespace rill
