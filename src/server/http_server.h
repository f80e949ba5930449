#pragma once
// HttpServer: HTTP/1.1 on Boost.Asio/Beast.
//
// Threads. A few I/O threads (io_threads, default 1) run every connection
// asynchronously (no thread per connection): reading and framing requests,
// writing responses, timers. Handlers (Dispatch) never run there: each
// complete request goes to a pool of handler_threads (default 4). A handler
// may parse megabytes of JSON, render a template and tokenize a long prompt;
// on an I/O thread that would stall every connection the thread serves
// (/health, streaming writes, disconnect detection). More I/O threads alone
// would only shrink the odds (N slow requests would still stall N threads),
// so the work is moved instead: the I/O threads never wait on a handler, and
// at worst a request waits in the pool's queue, which holds at most one
// request per connection (max_connections bounds it).
//
// Per connection: one request at a time (keep-alive; a pipelined request is
// read only after the previous response is written). While a response is in
// flight the socket is polled for hang-up every hangup_poll_ms (POLLRDHUP),
// whatever else the client has queued, and a client that goes away marks the
// Responder disconnected: its on_disconnect runs and handlers cancel their
// generation (so its KV blocks are freed within about one engine step).
//
// Limits (each refusal is an OpenAI-shaped JSON error, then the connection
// closes; server/http_framing.h has the framing rules):
//   header or trailer over max_header_bytes: 431; body over max_body_bytes:
//   413; bad Transfer-Encoding / Content-Length: 400; Expect other than
//   100-continue: 417 (100 Continue is sent once the head is accepted);
//   header not complete within header_timeout_s (from accept, or from the
//   first byte of a keep-alive request) or body not within body_timeout_s:
//   408; no request within idle_timeout_s on a kept-alive connection: closed;
//   more than max_connections open: 503 at once; a client that takes no
//   bytes for send_timeout_s, or lets more than max_write_queue_bytes queue
//   up (beyond one message), has its response abandoned (Responder marked
//   disconnected) and the connection closed. When accept() runs out of file
//   descriptors (EMFILE/ENFILE) it retries after accept_backoff_ms instead of
//   spinning, logging once per episode.
//
// Responses: HEAD gets the headers only (Content-Length of the body it would
// have had); an HTTP/1.0 client gets streams un-chunked, delimited by close.
// An exception in a connection's I/O closes that connection only (logged);
// one escaping a handler is a 500. Nothing a client sends ends the process.
//
// Lifetime: the server must outlive every Responder it handed out (release
// them, e.g. by stopping the engine, before destroying the server).
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
  int handler_threads = 4;
  size_t max_body_bytes = 8 << 20;
  size_t max_header_bytes = 64 << 10;
  double header_timeout_s = 30;
  double body_timeout_s = 60;
  double idle_timeout_s = 60;  // keep-alive: between requests
  double send_timeout_s = 60;  // no bytes taken by the client for this long
  size_t max_write_queue_bytes = 4 << 20;
  int max_connections = 0;  // 0: the fd limit (RLIMIT_NOFILE) less 64, at most 4096
  int hangup_poll_ms = 50;
  int accept_backoff_ms = 100;
};

// Events counted since start (for /stats and tests).
struct HttpServerCounters {
  int64_t rejected_at_capacity = 0;  // 503: over max_connections
  int64_t accept_backoffs = 0;       // accept() failed for lack of fds and waited
  int64_t request_timeouts = 0;      // 408: header or body too slow
  int64_t idle_closes = 0;           // keep-alive connections closed for idleness
  int64_t abandoned_responses = 0;   // client not reading (send timeout or write queue bound)
  int64_t connection_errors = 0;     // exceptions caught in a connection's I/O
};

class HttpServer {
 public:
  // Called on a handler thread for every complete request.
  using Dispatch = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, Dispatch dispatch);
  virtual ~HttpServer() = default;

  virtual int port() const = 0;
  // Graceful shutdown, step one (returns at once; idempotent): closes the
  // listener; idle keep-alive connections close; a request that completes on
  // an open connection from now on gets 503 with Connection: close; responses
  // in flight continue, and their connection closes after them. Poll
  // active_responses() until 0 (or a grace period ends), then stop().
  virtual void stop_accepting() = 0;
  // Requests dispatched whose response has not finished (fully written, or
  // abandoned because the client went away).
  virtual int64_t active_responses() const = 0;
  // Hard stop: stops accepting, closes every connection and joins the I/O
  // and handler threads (queued requests are dropped).
  virtual void stop() = 0;
  // Blocks until stop() (from another thread or a signal handler's thread).
  virtual void wait() = 0;
  virtual int64_t open_connections() const = 0;
  virtual HttpServerCounters counters() const = 0;
};

}  // namespace rill::server
