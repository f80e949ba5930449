// RequestHandle: a request's events as a blocking queue (rill/engine.h).
#include <condition_variable>
#include <deque>
#include <mutex>

#include "rill/engine.h"

namespace rill {

struct RequestHandle::Channel {
  std::mutex mu;
  std::condition_variable ready;
  std::deque<GenerationEvent> events;
};

RequestHandle::RequestHandle(std::shared_ptr<Channel> channel, uint64_t id, std::function<void(uint64_t)> cancel)
    : channel_(std::move(channel)), id_(id), cancel_(std::move(cancel)) {}

RequestHandle::~RequestHandle() {
  if (channel_ && !done_) cancel();
}

bool RequestHandle::next(GenerationEvent& event) {
  if (!channel_ || done_) return false;
  std::unique_lock lk(channel_->mu);
  channel_->ready.wait(lk, [&] { return !channel_->events.empty(); });
  event = std::move(channel_->events.front());
  channel_->events.pop_front();
  done_ = event.finished;
  return true;
}

void RequestHandle::cancel() {
  if (cancel_) cancel_(id_);
}

Result<RequestHandle> Engine::submit(GenerationRequest request) {
  auto channel = std::make_shared<RequestHandle::Channel>();
  auto id = submit(std::move(request), [channel](GenerationEvent&& event) {
    {
      std::lock_guard lk(channel->mu);
      channel->events.push_back(std::move(event));
    }
    channel->ready.notify_all();
  });
  if (!id.ok()) return id.error();
  return RequestHandle(std::move(channel), *id, [this](uint64_t i) { cancel(i); });
}

}  // namespace rill
