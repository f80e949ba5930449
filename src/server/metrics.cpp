#include "server/metrics.h"

#include <cstdio>

namespace rill::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void gauge(std::string& out, const char* name, const char* help, double v, const char* type = "gauge") {
  out +=
      std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(v) + "\n";
}

// One series per prefix-cache tier: `name`{tier="ram"|"disk"}.
void tier_family(std::string& out, const char* name, const char* help, const char* type, const EngineStats& s,
                 double (*value)(const CacheTierStats&)) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += std::string(name) + "{tier=\"ram\"} " + num(value(s.ram_tier)) + "\n";
  out += std::string(name) + "{tier=\"disk\"} " + num(value(s.disk_tier)) + "\n";
}

void render_tiers(const EngineStats& s, std::string& out) {
  using T = const CacheTierStats&;
  tier_family(out, "rill_kv_tier_enabled", "1 when the prefix-cache tier is configured", "gauge", s,
              [](T t) { return t.enabled ? 1.0 : 0.0; });
  tier_family(out, "rill_kv_tier_bytes", "bytes held by the prefix-cache tier", "gauge", s,
              [](T t) { return static_cast<double>(t.bytes); });
  tier_family(out, "rill_kv_tier_entries", "prefix runs held by the tier", "gauge", s,
              [](T t) { return static_cast<double>(t.entries); });
  tier_family(out, "rill_kv_tier_hits_total", "lookups that found a prefix in the tier", "counter", s,
              [](T t) { return static_cast<double>(t.hits); });
  tier_family(out, "rill_kv_tier_misses_total", "lookups that found nothing in the tier", "counter", s,
              [](T t) { return static_cast<double>(t.misses); });
  tier_family(out, "rill_kv_tier_evictions_total", "runs evicted by the tier's byte cap", "counter", s,
              [](T t) { return static_cast<double>(t.evictions); });
  tier_family(out, "rill_kv_tier_errors_total", "entries refused and removed on load (corrupt, foreign, failed)",
              "counter", s, [](T t) { return static_cast<double>(t.errors); });
  tier_family(out, "rill_kv_tier_loads_total", "runs loaded from the tier", "counter", s,
              [](T t) { return static_cast<double>(t.loads); });
  tier_family(out, "rill_kv_tier_load_seconds_total", "time spent loading runs from the tier", "counter", s,
              [](T t) { return t.load_seconds; });
  gauge(out, "rill_kv_tier_restored_tokens_total", "prompt tokens loaded back into the device cache from a tier",
        static_cast<double>(s.tier_restored_tokens), "counter");
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Histogram::observe(double seconds) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + num(kBounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_[kBounds.size()];
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard lk(mu_);
  auto it = requests_.find({route, status});
  if (it == requests_.end() && requests_.size() >= kMaxRequestSeries)
    it = requests_.try_emplace({"other", status}).first;
  if (it == requests_.end()) it = requests_.try_emplace({route, status}).first;
  ++it->second;
}

std::string Metrics::render(const EngineStats& s) const {
  std::string out;
  {
    std::lock_guard lk(mu_);
    out +=
        "# HELP rill_http_requests_total HTTP responses by route and status\n# TYPE rill_http_requests_total counter\n";
    for (const auto& [key, n] : requests_) {
      out += "rill_http_requests_total{route=\"" + escape_label_value(key.first) + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    }
  }
  gauge(out, "rill_requests_submitted_total", "generation requests accepted by the engine",
        static_cast<double>(s.requests_submitted), "counter");
  gauge(out, "rill_requests_finished_total", "generation requests finished", static_cast<double>(s.requests_finished),
        "counter");
  gauge(out, "rill_requests_rejected_total", "generation requests rejected at submission",
        static_cast<double>(s.requests_rejected), "counter");
  gauge(out, "rill_prompt_tokens_total", "prompt tokens of finished requests", static_cast<double>(s.prompt_tokens),
        "counter");
  gauge(out, "rill_cached_prompt_tokens_total", "prompt tokens served from the prefix cache",
        static_cast<double>(s.cached_tokens), "counter");
  gauge(out, "rill_generation_tokens_total", "generated tokens", static_cast<double>(s.completion_tokens), "counter");
  gauge(out, "rill_prefix_cache_hit_rate", "cached / prompt tokens",
        s.prompt_tokens > 0 ? static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : 0.0);
  gauge(out, "rill_engine_steps_total", "engine steps", static_cast<double>(s.steps), "counter");
  gauge(out, "rill_preemptions_total", "requests preempted for KV blocks", static_cast<double>(s.preemptions),
        "counter");
  if (!s.speculator.empty()) {
    const std::string label = "{speculator=\"" + escape_label_value(s.speculator) + "\"}";
    out += "# HELP rill_spec_draft_tokens_total draft tokens verified\n# TYPE rill_spec_draft_tokens_total counter\n";
    out += "rill_spec_draft_tokens_total" + label + " " + std::to_string(s.spec_draft_tokens) + "\n";
    out +=
        "# HELP rill_spec_accepted_tokens_total draft tokens accepted\n"
        "# TYPE rill_spec_accepted_tokens_total counter\n";
    out += "rill_spec_accepted_tokens_total" + label + " " + std::to_string(s.spec_accepted_tokens) + "\n";
    out += "# HELP rill_spec_acceptance_rate accepted / drafted tokens\n# TYPE rill_spec_acceptance_rate gauge\n";
    const double rate = s.spec_draft_tokens > 0
                            ? static_cast<double>(s.spec_accepted_tokens) / static_cast<double>(s.spec_draft_tokens)
                            : 0.0;
    out += "rill_spec_acceptance_rate" + label + " " + num(rate) + "\n";
  }
  gauge(out, "rill_requests_running", "requests in the running batch", s.running);
  gauge(out, "rill_requests_waiting", "requests waiting for admission", s.waiting);
  gauge(out, "rill_kv_blocks_total", "KV cache blocks", s.kv_blocks_total);
  gauge(out, "rill_kv_blocks_used", "KV cache blocks held by requests", s.kv_blocks_used);
  gauge(out, "rill_kv_blocks_cached", "unreferenced KV blocks kept for prefix reuse", s.kv_blocks_cached);
  render_tiers(s, out);
  gauge(out, "rill_open_streams", "streaming HTTP responses in progress", static_cast<double>(open_streams_.load()));
  out += "# HELP rill_batch_size sequences per engine step\n# TYPE rill_batch_size histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < EngineStats::kBatchSizeBounds.size(); ++i) {
    cumulative += s.batch_size_counts[i];
    out += "rill_batch_size_bucket{le=\"" + std::to_string(EngineStats::kBatchSizeBounds[i]) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  cumulative += s.batch_size_counts.back();
  out += "rill_batch_size_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += "rill_batch_size_sum " + std::to_string(s.batch_size_sum) + "\nrill_batch_size_count " +
         std::to_string(cumulative) + "\n";
  ttft_.render("rill_time_to_first_token_seconds", "time from request to first token", out);
  itl_.render("rill_inter_token_latency_seconds", "time between streamed tokens", out);
  return out;
}

}  // namespace rill::server
