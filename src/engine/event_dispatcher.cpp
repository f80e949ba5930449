#include "engine/event_dispatcher.h"

#include <exception>
#include <utility>

namespace rill {

EventDispatcher::EventDispatcher(FailureSink on_failure, size_t max_pending)
    : on_failure_(std::move(on_failure)), max_pending_(max_pending > 0 ? max_pending : 1) {
  thread_ = std::thread([this] { run(); });
}

EventDispatcher::~EventDispatcher() {
  flush();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EventDispatcher::post(uint64_t id, std::shared_ptr<const EventCallback> callback, GenerationEvent&& event) {
  if (!callback || !*callback) return;
  staged_.push_back(Item{id, std::move(callback), std::move(event)});
}

void EventDispatcher::flush() {
  if (staged_.empty()) return;
  std::unique_lock lk(mu_);
  space_.wait(lk, [&] { return queue_.size() < max_pending_; });
  for (Item& item : staged_) queue_.push_back(std::move(item));
  lk.unlock();
  staged_.clear();
  ready_.notify_one();
}

void EventDispatcher::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    ready_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and everything delivered
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    space_.notify_one();
    deliver(item);
    item = Item{};  // the callback's state is released off the lock
    lk.lock();
  }
}

void EventDispatcher::deliver(Item& item) {
  const bool final_event = item.event.finished;
  if (failed_.count(item.id) != 0) {
    if (!final_event) return;
    failed_.erase(item.id);
    try {
      (*item.callback)(std::move(item.event));
    } catch (...) {
      // The consumer failed before; the request is over either way.
    }
    return;
  }
  std::string failure;
  try {
    (*item.callback)(std::move(item.event));
    return;
  } catch (const std::exception& e) {
    failure = std::string("the event consumer failed: ") + e.what();
  } catch (...) {
    failure = "the event consumer failed";
  }
  if (final_event) return;  // the request is already over
  failed_.insert(item.id);
  on_failure_(item.id, std::move(failure));
}

}  // namespace rill
