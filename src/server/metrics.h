#pragma once
// Server metrics: request counters per route and status, token counters,
// the prefix-cache tiers' counters (rill_kv_tier_*{tier="ram"|"disk"}),
// TTFT / inter-token latency / batch-size histograms; rendered as Prometheus
// text (GET /metrics) together with the engine's stats. Thread-safe.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "rill/engine.h"

namespace rill::server {

class Histogram {
 public:
  // Upper bounds in seconds (the +Inf bucket is implicit).
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void observe(double seconds);
  // Appends the Prometheus text of this histogram named `name`.
  void render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> counts_{};
  double sum_ = 0;
  uint64_t count_ = 0;
};

// A label value escaped for the Prometheus text format (\\, \", \n).
std::string escape_label_value(const std::string& value);

class Metrics {
 public:
  // Distinct (route, status) series kept; later new ones count under
  // route="other", so the exposition stays bounded whatever callers pass.
  static constexpr size_t kMaxRequestSeries = 512;
  // `route` is a route template from a fixed set (App::route_label), never a
  // raw path.
  void count_request(const std::string& route, int status);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_itl(double seconds) { itl_.observe(seconds); }
  void stream_opened() { ++open_streams_; }
  void stream_closed() { --open_streams_; }
  int64_t open_streams() const { return open_streams_; }

  // Prometheus exposition text, with the engine's counters and gauges.
  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, itl_;
  std::atomic<int64_t> open_streams_{0};
};

}  // namespace rill::server
