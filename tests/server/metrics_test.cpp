// Metrics::render: the prefix-cache tier families carry one series per tier
// with the engine's numbers (Prometheus text: HELP, TYPE, then samples).
#include "server/metrics.h"

#include "server/app.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

namespace rill::server {
namespace {

// "name{labels}" -> value, and "name" -> TYPE, from Prometheus text.
struct Parsed {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
};

Parsed parse(const std::string& text) {
  Parsed p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      p.types[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      const size_t sp = line.rfind(' ');
      p.samples[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
  }
  return p;
}

TEST(Metrics, TierFamiliesCarryEachTiersNumbers) {
  EngineStats s;
  s.ram_tier = {true, 4096, 2, 5, 3, 1, 0, 5, 0.25};
  s.disk_tier = {true, 1 << 20, 7, 2, 6, 4, 1, 2, 0.5};
  s.tier_restored_tokens = 640;
  Metrics m;
  const Parsed p = parse(m.render(s));
  struct Want {
    const char* name;
    const char* type;
    double ram, disk;
  };
  const Want wants[] = {
      {"rill_kv_tier_enabled", "gauge", 1, 1},
      {"rill_kv_tier_bytes", "gauge", 4096, 1 << 20},
      {"rill_kv_tier_entries", "gauge", 2, 7},
      {"rill_kv_tier_hits_total", "counter", 5, 2},
      {"rill_kv_tier_misses_total", "counter", 3, 6},
      {"rill_kv_tier_evictions_total", "counter", 1, 4},
      {"rill_kv_tier_errors_total", "counter", 0, 1},
      {"rill_kv_tier_loads_total", "counter", 5, 2},
      {"rill_kv_tier_load_seconds_total", "counter", 0.25, 0.5},
  };
  for (const Want& w : wants) {
    EXPECT_EQ(p.types.at(w.name), w.type) << w.name;
    const std::string n = w.name;
    ASSERT_TRUE(p.samples.contains(n + "{tier=\"ram\"}")) << n;
    EXPECT_DOUBLE_EQ(p.samples.at(n + "{tier=\"ram\"}"), w.ram) << n;
    EXPECT_DOUBLE_EQ(p.samples.at(n + "{tier=\"disk\"}"), w.disk) << n;
  }
  EXPECT_EQ(p.types.at("rill_kv_tier_restored_tokens_total"), "counter");
  EXPECT_DOUBLE_EQ(p.samples.at("rill_kv_tier_restored_tokens_total"), 640);
}

TEST(Metrics, DisabledTiersReportZeros) {
  Metrics m;
  const Parsed p = parse(m.render(EngineStats{}));
  EXPECT_DOUBLE_EQ(p.samples.at("rill_kv_tier_enabled{tier=\"ram\"}"), 0);
  EXPECT_DOUBLE_EQ(p.samples.at("rill_kv_tier_enabled{tier=\"disk\"}"), 0);
  EXPECT_DOUBLE_EQ(p.samples.at("rill_kv_tier_bytes{tier=\"disk\"}"), 0);
  EXPECT_DOUBLE_EQ(p.samples.at("rill_kv_tier_restored_tokens_total"), 0);
}

// Issue 15: a '"' in a label value broke the exposition format.
TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Metrics m;
  m.count_request("/x\"y", 200);
  const std::string text = m.render(EngineStats{});
  EXPECT_NE(text.find("rill_http_requests_total{route=\"/x\\\"y\",status=\"200\"} 1\n"), std::string::npos) << text;
}

// Issue 15: every raw path became a series kept forever (3,000 long paths
// added 172 MiB); the label is now a route template from a fixed set.
TEST(Metrics, RoutesAreLabelledByTemplate) {
  EXPECT_STREQ(App::route_label("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_STREQ(App::route_label("/v1/responses/resp_123"), "/v1/responses/{id}");
  EXPECT_STREQ(App::route_label("/index.html"), "/");
  EXPECT_STREQ(App::route_label("/assets/chat.js"), "/assets/{name}");
  EXPECT_STREQ(App::allowed_methods("/assets/{name}"), "GET, HEAD, OPTIONS");
  EXPECT_STREQ(App::route_label("/v1/chat/completions/"), "other");
  EXPECT_STREQ(App::route_label("/\"" + std::string(5000, 'a')), "other");
  EXPECT_STREQ(App::allowed_methods("/health"), "GET, HEAD, OPTIONS");
  EXPECT_STREQ(App::allowed_methods("/v1/responses/{id}"), "GET, HEAD, DELETE, OPTIONS");
  Metrics m;
  for (int i = 0; i < 3000; ++i) m.count_request(App::route_label("/junk/" + std::to_string(i)), 401);
  const std::string text = m.render(EngineStats{});
  EXPECT_NE(text.find("rill_http_requests_total{route=\"other\",status=\"401\"} 3000\n"), std::string::npos);
  EXPECT_EQ(text.find("/junk/"), std::string::npos);
}

TEST(Metrics, RequestSeriesAreBounded) {
  Metrics m;
  for (size_t i = 0; i < Metrics::kMaxRequestSeries + 100; ++i) m.count_request("/r" + std::to_string(i), 200);
  const std::string text = m.render(EngineStats{});
  size_t n_series = 0;
  for (size_t pos = 0; (pos = text.find("rill_http_requests_total{", pos)) != std::string::npos; ++pos) ++n_series;
  EXPECT_LE(n_series, Metrics::kMaxRequestSeries + 1);
  EXPECT_NE(text.find("route=\"other\",status=\"200\"} 100\n"), std::string::npos);
}

}  // namespace
}  // namespace rill::server
