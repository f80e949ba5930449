#pragma once
// HttpServer: HTTP/1.1 on Boost.Asio/Beast. A few I/O threads serve every
// connection asynchronously (no thread per connection), so thousands of
// idle or streaming clients cost only their buffers.
//
// Per connection: one request at a time (keep-alive; a pipelined request
// waits for the previous response). While a response is in flight a read
// stays posted on the socket, so a client that goes away is noticed at once
// and the Responder's on_disconnect runs (handlers cancel their generation).
// Bodies over max_body_bytes get 413 and malformed requests 400, both in the
// OpenAI error shape, and the connection closes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/result.h"
#include "server/http.h"

namespace rill::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see HttpServer::port())
  int io_threads = 1;
  size_t max_body_bytes = 8 << 20;
};

class HttpServer {
 public:
  // Called on an I/O thread for every complete request.
  using Dispatch = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, Dispatch dispatch);
  virtual ~HttpServer() = default;

  virtual int port() const = 0;
  // Stops accepting, closes every connection and joins the I/O threads.
  virtual void stop() = 0;
  // Blocks until stop() (from another thread or a signal handler's thread).
  virtual void wait() = 0;
  virtual int64_t open_connections() const = 0;
};

}  // namespace rill::server
