#pragma once
// FakeResponder: a Responder that records what a handler sent, for handler
// unit tests without a network. wait() blocks until the response ended.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http.h"

namespace rill::server::testing {

class FakeResponder final : public Responder {
 public:
  void send(int status, std::string content_type, std::string body, HeaderList extra = {}) override {
    std::lock_guard lk(mu_);
    status_ = status;
    content_type_ = std::move(content_type);
    body_ = std::move(body);
    headers_ = std::move(extra);
    done_ = true;
    cv_.notify_all();
  }
  void start_stream(std::string content_type, HeaderList extra = {}) override {
    std::lock_guard lk(mu_);
    status_ = 200;
    streaming_ = true;
    content_type_ = std::move(content_type);
    headers_ = std::move(extra);
  }
  void write(std::string chunk) override {
    std::lock_guard lk(mu_);
    body_ += chunk;
    chunks_.push_back(std::move(chunk));
  }
  void end() override {
    std::lock_guard lk(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void on_disconnect(std::function<void()> f) override {
    std::lock_guard lk(mu_);
    on_disconnect_ = std::move(f);
  }
  bool disconnected() const override { return disconnected_; }

  // Simulates the client going away.
  void disconnect() {
    std::function<void()> f;
    {
      std::lock_guard lk(mu_);
      disconnected_ = true;
      f = std::move(on_disconnect_);
    }
    if (f) f();
  }
  // Waits until send() or end(); false on timeout.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return done_; });
  }
  int status() const {
    std::lock_guard lk(mu_);
    return status_;
  }
  bool streaming() const {
    std::lock_guard lk(mu_);
    return streaming_;
  }
  std::string body() const {
    std::lock_guard lk(mu_);
    return body_;
  }
  std::string content_type() const {
    std::lock_guard lk(mu_);
    return content_type_;
  }
  nlohmann::json json() const { return nlohmann::json::parse(body()); }
  // SSE frames: the "data:" payloads in order (and event names when present).
  std::vector<std::pair<std::string, std::string>> events() const {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string b = body();
    size_t pos = 0;
    while (pos < b.size()) {
      size_t end = b.find("\n\n", pos);
      if (end == std::string::npos) break;
      std::string frame = b.substr(pos, end - pos), name, data;
      size_t lp = 0;
      while (lp <= frame.size()) {
        size_t le = frame.find('\n', lp);
        if (le == std::string::npos) le = frame.size();
        std::string line = frame.substr(lp, le - lp);
        if (line.rfind("event: ", 0) == 0) name = line.substr(7);
        if (line.rfind("data: ", 0) == 0) data = line.substr(6);
        lp = le + 1;
      }
      out.emplace_back(name, data);
      pos = end + 2;
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  bool streaming_ = false, done_ = false;
  std::atomic<bool> disconnected_{false};
  std::string content_type_, body_;
  HeaderList headers_;
  std::vector<std::string> chunks_;
  std::function<void()> on_disconnect_;
};

}  // namespace rill::server::testing
