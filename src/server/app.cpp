#include "server/app.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "server/api_handlers.h"
#include "server/errors.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/web/web_page.h"

namespace rill::server {
namespace {

// Adds the CORS headers to whatever the handler sends and counts the
// response's status per route.
class RouteResponder final : public Responder {
 public:
  RouteResponder(std::shared_ptr<Responder> inner, HeaderList extra, Metrics* metrics, const char* route)
      : inner_(std::move(inner)), extra_(std::move(extra)), metrics_(metrics), route_(std::move(route)) {}
  void send(int status, std::string content_type, std::string body, HeaderList extra) override {
    if (metrics_) metrics_->count_request(route_, status);
    extra.insert(extra.end(), extra_.begin(), extra_.end());
    inner_->send(status, std::move(content_type), std::move(body), std::move(extra));
  }
  void start_stream(std::string content_type, HeaderList extra) override {
    if (metrics_) metrics_->count_request(route_, 200);  // handlers count open streams themselves
    extra.insert(extra.end(), extra_.begin(), extra_.end());
    inner_->start_stream(std::move(content_type), std::move(extra));
  }
  void write(std::string chunk) override { inner_->write(std::move(chunk)); }
  void end() override { inner_->end(); }
  void on_disconnect(std::function<void()> f) override { inner_->on_disconnect(std::move(f)); }
  bool disconnected() const override { return inner_->disconnected(); }
  // Before the first send / start_stream only.
  void add_header(std::string name, std::string value) { extra_.emplace_back(std::move(name), std::move(value)); }

 private:
  std::shared_ptr<Responder> inner_;
  HeaderList extra_;
  Metrics* metrics_;
  std::string route_;
};

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

struct Route {
  const char* label;
  const char* allow;
};

// Every route the server answers. A path maps to exactly one entry.
constexpr Route kRoutes[] = {
    {"/", "GET, HEAD, OPTIONS"},
    {"/assets/{name}", "GET, HEAD, OPTIONS"},
    {"/health", "GET, HEAD, OPTIONS"},
    {"/v1/models", "GET, HEAD, OPTIONS"},
    {"/v1/models/{id}", "GET, HEAD, OPTIONS"},
    {"/metrics", "GET, HEAD, OPTIONS"},
    {"/stats", "GET, HEAD, OPTIONS"},
    {"/v1/chat/completions", "POST, OPTIONS"},
    {"/v1/completions", "POST, OPTIONS"},
    {"/v1/responses", "POST, OPTIONS"},
    {"/v1/responses/{id}", "GET, HEAD, DELETE, OPTIONS"},
    {"/v1/responses/{id}/input_items", "GET, HEAD, OPTIONS"},
    {"/v1/messages", "POST, OPTIONS"},
    {"/v1/messages/count_tokens", "POST, OPTIONS"},
    {"/v1/cache/warm", "POST, OPTIONS"},
    {"/v1/embeddings", "POST, OPTIONS"},
};
constexpr const char* kOtherRoute = "other";

// The API paths clients whose base URL lacks /v1 call: each answers as its
// /v1 form (and so does everything under it, e.g. /responses/{id}).
constexpr const char* kUnprefixed[] = {"/chat/completions", "/completions", "/models",
                                       "/responses",        "/embeddings",  "/messages"};

// The path as routed: an unprefixed alias gets its /v1.
std::string canonical_path(const std::string& p) {
  for (const char* a : kUnprefixed) {
    const size_t n = std::strlen(a);
    if (p.compare(0, n, a) == 0 && (p.size() == n || p[n] == '/')) return "/v1" + p;
  }
  return p;
}

// Access-Control-Request-Headers as a browser sends it: header names
// (token characters) separated by commas and spaces; anything else is
// not echoed.
bool is_header_list(const std::string& v) {
  if (v.empty() || v.size() > 1024) return false;
  for (unsigned char c : v) {
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == ',' || c == ' ')) return false;
  }
  return true;
}

bool allows(const char* route, const std::string& method) {
  const std::string allow = App::allowed_methods(route);
  size_t pos = 0;
  while (pos < allow.size()) {
    const size_t comma = allow.find(',', pos);
    const std::string item = allow.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item == method) return true;
    if (comma == std::string::npos) break;
    pos = comma + 2;  // ", "
  }
  return false;
}

// Constant-time comparison, so the key cannot be guessed byte by byte.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

const char* App::route_label(const std::string& path) {
  const std::string p = canonical_path(path);
  if (p == "/index.html") return "/";
  if (starts_with(p, "/assets/")) return "/assets/{name}";
  if (starts_with(p, "/v1/models/") && p.size() > std::strlen("/v1/models/")) return "/v1/models/{id}";
  if (starts_with(p, "/v1/responses/") && p.size() > std::strlen("/v1/responses/")) {
    const std::string_view rest = std::string_view(p).substr(std::strlen("/v1/responses/"));
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) return "/v1/responses/{id}";
    if (slash > 0 && rest.substr(slash) == "/input_items") return "/v1/responses/{id}/input_items";
    return kOtherRoute;
  }
  for (const Route& r : kRoutes) {
    if (p == r.label) return r.label;
  }
  return kOtherRoute;
}

const char* App::allowed_methods(const char* route) {
  for (const Route& r : kRoutes) {
    if (std::strcmp(route, r.label) == 0) return r.allow;
  }
  return "";
}

bool App::authorized(const HttpRequest& req) const {
  const std::string& key = ctx_.options.api_key;
  if (key.empty()) return true;
  const std::string auth = req.header("authorization");
  if (starts_with(auth, "Bearer ") && same_secret(auth.substr(7), key)) return true;
  return same_secret(req.header("x-api-key"), key);
}

HeaderList App::cors_headers(const HttpRequest& req) const {
  const auto& origins = ctx_.options.cors_origins;
  if (origins.empty()) return {};
  const std::string origin = req.header("origin");
  const bool any = std::find(origins.begin(), origins.end(), "*") != origins.end();
  if (!any && std::find(origins.begin(), origins.end(), origin) == origins.end()) return {};
  // A preflight's requested headers are allowed as asked (the official JS
  // SDKs send x-stainless-*, anthropic-dangerous-direct-browser-access, ...).
  const std::string asked = req.header("access-control-request-headers");
  return {{"Access-Control-Allow-Origin", any ? "*" : origin},
          {"Access-Control-Allow-Headers",
           is_header_list(asked) ? asked : "Authorization, Content-Type, x-api-key, anthropic-version"},
          {"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
          {"Access-Control-Max-Age", "600"},
          {"Vary", "Origin, Access-Control-Request-Headers"}};
}

void App::dispatch(const HttpRequest& req, std::shared_ptr<Responder> raw) {
  const std::string p = canonical_path(req.path);
  const bool anthropic = starts_with(p, "/v1/messages");
  const char* route = route_label(p);
  auto res = std::make_shared<RouteResponder>(std::move(raw), cors_headers(req), ctx_.metrics, route);
  auto fail = [&](int status, std::string message, std::string type) {
    ApiError e{status, std::move(message), std::move(type)};
    anthropic ? send_anthropic_error(*res, e) : send_error(*res, e);
  };
  if (req.method == "OPTIONS") {  // CORS preflight
    res->send(204, "text/plain", "", {});
    return;
  }
  const bool known = std::strcmp(route, kOtherRoute) != 0;
  auto method_not_allowed = [&] {
    res->add_header("Allow", allowed_methods(route));
    fail(405, "method " + req.method + " is not allowed on " + p + " (allowed: " + allowed_methods(route) + ")",
         "invalid_request_error");
  };
  // HEAD is answered as GET; the server drops the body (server/http_server.h).
  const bool get = req.method == "GET" || req.method == "HEAD";
  const bool page_route = std::strcmp(route, "/") == 0 || std::strcmp(route, "/assets/{name}") == 0;
  const bool open_route = page_route || std::strcmp(route, "/health") == 0;
  // The open routes need no key, so their method is checked first.
  if (open_route && !allows(route, req.method)) return method_not_allowed();
  if (std::strcmp(route, "/health") == 0) return health(res);
  // The chat page holds no secrets and a browser cannot attach a key when it
  // opens a page; its API calls carry the key (?key=...).
  if (page_route) {
    auto page = web_page_response(p, req.query);
    if (!page) return fail(404, "no such file " + p, "not_found_error");
    return res->send(page->status, std::move(page->content_type), std::move(page->body), std::move(page->headers));
  }
  if (!authorized(req)) {
    return fail(401, "invalid or missing API key (send Authorization: Bearer <key> or x-api-key)",
                "authentication_error");
  }
  if (!known) return fail(404, "no route " + req.method + " " + p, "not_found_error");
  if (!allows(route, req.method)) return method_not_allowed();
  const bool post = req.method == "POST", del = req.method == "DELETE";
  const std::string r = route;
  if (get && r == "/v1/models") return models(res);
  if (get && r == "/v1/models/{id}") return model(p.substr(std::strlen("/v1/models/")), res);
  if (get && r == "/metrics") return metrics(res);
  if (get && r == "/stats") return stats(res);
  if (post && r == "/v1/embeddings") return handle_embeddings(ctx_, req, res);
  if (post && ctx_.engine.model().embedding().bidirectional) {
    // An encoder computes embeddings only: every generation route refuses.
    const std::string msg = "model: '" + ctx_.options.model_id +
                            "' is an embedding (encoder) model and generates no text; use POST /v1/embeddings";
    if (anthropic) return send_anthropic_error(*res, ApiError(400, msg, "invalid_request_error", "model"));
    return send_error(*res, ApiError(400, msg, "invalid_request_error", "model", "model_not_supported"));
  }
  if (post && r == "/v1/chat/completions") return handle_chat_completions(ctx_, req, res);
  if (post && r == "/v1/completions") return handle_completions(ctx_, req, res);
  if (post && r == "/v1/responses") return handle_responses_create(ctx_, req, res);
  if (get && r == "/v1/responses/{id}") return handle_responses_get(ctx_, req, res);
  if (del && r == "/v1/responses/{id}") return handle_responses_delete(ctx_, req, res);
  if (get && r == "/v1/responses/{id}/input_items") return handle_responses_input_items(ctx_, req, res);
  if (post && r == "/v1/messages") return handle_messages(ctx_, req, res);
  if (post && r == "/v1/messages/count_tokens") return handle_count_tokens(ctx_, req, res);
  if (post && r == "/v1/cache/warm") return handle_cache_warm(ctx_, req, res);
  method_not_allowed();  // unreachable while kRoutes and the table above agree
}

void App::health(std::shared_ptr<Responder> res) {
  res->send(200, "application/json", R"({"status":"ok"})", {});
}

nlohmann::json App::model_object() const {
  return {{"id", ctx_.options.model_id},
          {"object", "model"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"owned_by", "rill"},
          {"context_length", ctx_.engine.model().n_ctx()}};
}

void App::models(std::shared_ptr<Responder> res) {
  nlohmann::json body = {{"object", "list"}, {"data", nlohmann::json::array({model_object()})}};
  res->send(200, "application/json", body.dump(), {});
}

void App::model(const std::string& id, std::shared_ptr<Responder> res) {
  if (id != ctx_.options.model_id) {
    return send_error(
        *res,
        ApiError(404, "The model '" + id + "' does not exist (this server serves '" + ctx_.options.model_id + "')",
                 "invalid_request_error", "model", "model_not_found"));
  }
  res->send(200, "application/json", model_object().dump(), {});
}

void App::metrics(std::shared_ptr<Responder> res) {
  std::string text = ctx_.metrics ? ctx_.metrics->render(ctx_.engine.stats()) : std::string();
  res->send(200, "text/plain; version=0.0.4", std::move(text), {});
}

void App::stats(std::shared_ptr<Responder> res) {
  const EngineStats s = ctx_.engine.stats();
  const int64_t queried = s.prompt_tokens;
  nlohmann::json engine = {
      {"requests_submitted", s.requests_submitted},
      {"requests_finished", s.requests_finished},
      {"requests_rejected", s.requests_rejected},
      {"running", s.running},
      {"waiting", s.waiting},
      {"active_requests", s.running + s.waiting},
      {"steps", s.steps},
      {"steps_pipelined", s.steps_pipelined},
      {"preemptions", s.preemptions},
      {"prompt_tokens", s.prompt_tokens},
      {"cached_tokens", s.cached_tokens},
      {"completion_tokens", s.completion_tokens},
      {"prefix_hit_rate", queried > 0 ? static_cast<double>(s.cached_tokens) / static_cast<double>(queried) : 0.0},
  };
  // What latency-aware step planning decided (--max-step-ms).
  engine["step_planning"] = {{"fixed_ms", s.step_fixed_ms},
                             {"ms_per_token", s.step_ms_per_token},
                             {"last_target_ms", s.step_target_ms},
                             {"last_prefill_cap_tokens", s.prefill_cap_tokens},
                             {"steps_prefill_capped", s.steps_prefill_capped}};
  // Speculative decoding (--spec): null when off.
  engine["speculative"] = s.speculator.empty() ? nlohmann::json(nullptr)
                                               : nlohmann::json{{"speculator", s.speculator},
                                                                {"draft_tokens", s.spec_draft_tokens},
                                                                {"accepted_tokens", s.spec_accepted_tokens}};
  nlohmann::json kv = {{"block_size", s.kv_block_size},           {"blocks_total", s.kv_blocks_total},
                       {"blocks_used", s.kv_blocks_used},         {"blocks_cached", s.kv_blocks_cached},
                       {"bytes_per_token", s.kv_bytes_per_token}, {"tail_bytes", s.kv_tail_bytes}};
  auto tier = [](const CacheTierStats& t) {
    return nlohmann::json{{"enabled", t.enabled},  {"bytes", t.bytes},     {"entries", t.entries},
                          {"hits", t.hits},        {"misses", t.misses},   {"evictions", t.evictions},
                          {"errors", t.errors},    {"loads", t.loads},     {"load_seconds", t.load_seconds},
                          {"queued", t.queued},    {"written", t.written}, {"dropped", t.dropped},
                          {"replaced", t.replaced}};
  };
  kv["tiers"] = {{"ram", tier(s.ram_tier)}, {"disk", tier(s.disk_tier)}, {"restored_tokens", s.tier_restored_tokens}};
  nlohmann::json body = {{"model", ctx_.options.model_id}, {"engine", engine}, {"kv", kv}};
  nlohmann::json http = {{"open_streams", ctx_.metrics ? ctx_.metrics->open_streams() : 0}};
  if (http_ != nullptr) {
    const HttpServerCounters c = http_->counters();
    http["open_connections"] = http_->open_connections();
    http["active_responses"] = http_->active_responses();
    http["rejected_at_capacity"] = c.rejected_at_capacity;
    http["accept_backoffs"] = c.accept_backoffs;
    http["request_timeouts"] = c.request_timeouts;
    http["idle_closes"] = c.idle_closes;
    http["abandoned_responses"] = c.abandoned_responses;
    http["connection_errors"] = c.connection_errors;
  } else {
    http["open_connections"] = 0;
  }
  body["http"] = std::move(http);
  if (ctx_.responses) body["response_store"] = to_json(ctx_.responses->stats());
  res->send(200, "application/json", body.dump(), {});
}

}  // namespace rill::server
