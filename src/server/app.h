#pragma once
// App: the route table and the cross-cutting rules every request passes
// through: API key (Bearer or x-api-key; /health stays open), CORS, request
// counting; then the API handlers (server/api_handlers.h) and the small
// endpoints (/health, /v1/models, /metrics, /stats, the chat page).
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/http.h"
#include "server/http_server.h"
#include "server/server_context.h"

namespace rill::server {

class App {
 public:
  explicit App(ServerContext& ctx) : ctx_(ctx) {}
  // Serves one request (on a handler thread; see server/http_server.h).
  void dispatch(const HttpRequest& req, std::shared_ptr<Responder> res);
  // The route template a path is counted under in /metrics, from a fixed
  // set ("/v1/responses/{id}"; "other" for every unknown path), so a client
  // cannot add series by inventing paths.
  static const char* route_label(const std::string& path);
  // The Allow header of a route template ("" for "other"). HEAD goes with
  // GET (the server sends the headers only); OPTIONS is the CORS preflight.
  static const char* allowed_methods(const char* route);
  // The HTTP server whose connections and counters /stats shows (set by the
  // serve command; must outlive the App's requests).
  void set_http_server(const HttpServer* http) { http_ = http; }

 private:
  bool authorized(const HttpRequest& req) const;
  HeaderList cors_headers(const HttpRequest& req) const;
  void health(std::shared_ptr<Responder> res);
  void models(std::shared_ptr<Responder> res);
  // GET /v1/models/{id}: the served model, or a 404 naming `model`.
  void model(const std::string& id, std::shared_ptr<Responder> res);
  nlohmann::json model_object() const;
  void metrics(std::shared_ptr<Responder> res);
  void stats(std::shared_ptr<Responder> res);

  ServerContext& ctx_;
  const HttpServer* http_ = nullptr;
};

}  // namespace rill::server
