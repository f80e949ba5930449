#pragma once
// The HTTP surface the API handlers see, independent of the network layer
// (server/http_server.cpp runs it on Boost.Beast). Handlers never block: they
// validate, submit to the engine and return; the engine's event callbacks
// then write into the Responder from the engine's event dispatcher thread.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rill::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", "OPTIONS", ...
  std::string path;                            // without the query string
  std::string query;                           // after '?', undecoded
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;

  // The header's value, or "" when absent. `name` in lower case.
  std::string header(std::string_view name) const {
    auto it = headers.find(std::string(name));
    return it == headers.end() ? std::string() : it->second;
  }
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The reply to one request. Thread-safe: any thread may call it (writes are
// queued to the connection's I/O strand, in call order). Either send() once,
// or start_stream(), any number of write(), then end(). Calls after the
// client went away are ignored.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, std::string content_type, std::string body, HeaderList extra = {}) = 0;
  // A 200 response whose body follows in chunks (SSE: text/event-stream).
  virtual void start_stream(std::string content_type = "text/event-stream", HeaderList extra = {}) = 0;
  virtual void write(std::string chunk) = 0;
  virtual void end() = 0;
  // `f` runs once, on an I/O thread, if the client disconnects before end()
  // (at once if it already has). Handlers cancel their generation there.
  virtual void on_disconnect(std::function<void()> f) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

}  // namespace rill::server
