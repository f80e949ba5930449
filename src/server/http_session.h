#pragma once
// One HTTP connection (Session) and the Responder of its current request.
// Internal to the server layer: http_server.cpp accepts sockets and owns the
// threads; everything a connection does lives here. Every member of Session
// runs on the connection's strand unless noted.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "server/http.h"
#include "server/http_framing.h"
#include "server/http_server.h"

namespace rill::server {

class Session;

// State every connection shares with the server. Held by shared_ptr so a
// connection can count itself out whatever the order of destruction.
struct ServerShared {
  // Owned here, not by the HttpServer: every Session holds this struct, so
  // the io_context (and the services its sockets and timers are destroyed
  // through) lives until the last Session is gone.
  boost::asio::io_context ioc;
  HttpServerOptions options;
  HttpLimits limits;
  // Hands a complete request to the handler pool (thread-safe).
  std::function<void(HttpRequest, std::shared_ptr<Responder>)> submit;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> n_open{0};
  std::atomic<int64_t> n_active{0};
  struct {
    std::atomic<int64_t> rejected_at_capacity{0}, accept_backoffs{0}, request_timeouts{0}, idle_closes{0},
        abandoned_responses{0}, connection_errors{0};
  } counters;

  // Open sessions, for stop_accepting(); keys are never dereferenced.
  std::mutex sessions_mu;
  std::unordered_map<const Session*, std::weak_ptr<Session>> sessions;
};

// Starts a session on an accepted socket (the socket's executor must be a
// strand). With `reject_status` != 0 the session only answers that error
// (503 over the connection cap) and closes.
void start_session(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerShared> shared, int reject_status = 0,
                   std::string reject_message = {});

// Posts drain() to a session's strand: closes it when idle (stop_accepting).
void drain_session(const std::shared_ptr<Session>& session);

// Posts close() to a session's strand (HttpServer::stop).
void close_session(const std::shared_ptr<Session>& session);

}  // namespace rill::server
