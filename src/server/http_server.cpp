#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/errors.h"

namespace rill::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const char* reason_phrase(int status) {
  return http::obsolete_reason(static_cast<http::status>(status)).data();
}

std::string status_line_and_headers(int status, const std::string& content_type, const HeaderList& extra,
                                    const std::string& framing, bool keep_alive) {
  std::string s = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  s += "Content-Type: " + content_type + "\r\n";
  s += framing;
  for (const auto& [k, v] : extra) s += k + ": " + v + "\r\n";
  s += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  s += "\r\n";
  return s;
}

class Session;

// The Responder of one request on one Session. Every call posts to the
// session's strand, so calls from the engine thread keep their order.
class SessionResponder final : public Responder, public std::enable_shared_from_this<SessionResponder> {
 public:
  SessionResponder(std::shared_ptr<Session> session, bool keep_alive)
      : session_(std::move(session)), keep_alive_(keep_alive) {}

  void send(int status, std::string content_type, std::string body, HeaderList extra) override;
  void start_stream(std::string content_type, HeaderList extra) override;
  void write(std::string chunk) override;
  void end() override;
  void on_disconnect(std::function<void()> f) override;
  bool disconnected() const override { return disconnected_; }

  // Strand only.
  void mark_disconnected();
  bool finished() const { return finished_; }

 private:
  void post(std::function<void(Session&)> f);

  std::shared_ptr<Session> session_;
  bool keep_alive_;
  std::atomic<bool> disconnected_{false};
  bool finished_ = false;  // strand only: send() or end() issued
  bool streaming_ = false;
  std::mutex mu_;
  std::function<void()> on_disconnect_;
  bool disconnect_fired_ = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpServerOptions& options, const HttpServer::Dispatch& dispatch,
          std::atomic<int64_t>& n_open)
      : stream_(std::move(socket)), options_(options), dispatch_(dispatch), n_open_(n_open) {
    ++n_open_;
  }
  ~Session() { --n_open_; }

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_next(); });
  }

  // Strand only: queue bytes; `last` closes the response (and the
  // connection when not keep-alive).
  void queue_write(std::string bytes, bool response_done, bool close_after) {
    if (closed_) return;
    writes_.push_back({std::move(bytes), response_done, close_after});
    if (!writing_) write_next();
  }
  auto executor() { return stream_.get_executor(); }
  void close() {
    if (closed_) return;
    closed_ = true;
    current_.reset();  // breaks the session <-> responder cycle
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

 private:
  struct Write {
    std::string bytes;
    bool response_done;
    bool close_after;
  };

  void read_next() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(64 * 1024);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) {
      // The client went away (or sent garbage) while a response may still
      // be in flight.
      if (current_) current_->mark_disconnected();
      const bool in_flight = current_ && !current_->finished();
      if (ec == http::error::body_limit || ec == http::error::header_limit) {
        reject(413, "request body exceeds the limit of " + std::to_string(options_.max_body_bytes) + " bytes");
      } else if (!in_flight && ec != http::error::end_of_stream && ec.category() == beast::error_code(http::error::bad_method).category()) {
        reject(400, "malformed HTTP request: " + ec.message());
      } else {
        close();
      }
      return;
    }
    http::request<http::string_body> msg = parser_->release();
    if (current_ && !current_->finished()) {
      pending_ = std::move(msg);  // pipelined: runs after the current response
      return;
    }
    handle(std::move(msg));
  }

  void handle(http::request<http::string_body> msg) {
    HttpRequest req;
    req.method = std::string(msg.method_string());
    const std::string target(msg.target());
    const size_t q = target.find('?');
    req.path = target.substr(0, q);
    if (q != std::string::npos) req.query = target.substr(q + 1);
    for (const auto& field : msg) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      req.headers[name] = std::string(field.value());
    }
    req.body = std::move(msg.body());
    current_ = std::make_shared<SessionResponder>(shared_from_this(), msg.keep_alive());
    // Keep a read posted: it notices a disconnect, or parks a pipelined request.
    read_next();
    try {
      dispatch_(req, current_);
    } catch (const std::exception& e) {
      send_error(*current_, ApiError{500, std::string("internal error: ") + e.what(), "server_error"});
    }
  }

  void reject(int status, const std::string& message) {
    const std::string body = openai_error_body(ApiError{status, message}).dump();
    queue_write(status_line_and_headers(status, "application/json", {},
                                        "Content-Length: " + std::to_string(body.size()) + "\r\n", false) +
                    body,
                true, true);
  }

  void write_next() {
    if (writes_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    asio::async_write(stream_.socket(), asio::buffer(writes_.front().bytes),
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    Write done = std::move(writes_.front());
    writes_.pop_front();
    if (ec) {
      if (current_) current_->mark_disconnected();
      close();
      return;
    }
    if (done.close_after) {
      close();
      return;
    }
    if (done.response_done && pending_) {
      auto next = std::move(*pending_);
      pending_.reset();
      handle(std::move(next));
    }
    write_next();
  }

  beast::tcp_stream stream_;
  const HttpServerOptions& options_;
  const HttpServer::Dispatch& dispatch_;
  std::atomic<int64_t>& n_open_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request<http::string_body>> pending_;
  std::shared_ptr<SessionResponder> current_;
  std::deque<Write> writes_;
  bool writing_ = false;
  bool closed_ = false;
};

void SessionResponder::post(std::function<void(Session&)> f) {
  asio::post(session_->executor(), [self = shared_from_this(), f = std::move(f)] { f(*self->session_); });
}

void SessionResponder::send(int status, std::string content_type, std::string body, HeaderList extra) {
  post([this, status, ct = std::move(content_type), body = std::move(body), extra = std::move(extra)](Session& s) {
    if (finished_ || streaming_ || disconnected_) return;
    finished_ = true;
    std::string bytes = status_line_and_headers(status, ct, extra,
                                                "Content-Length: " + std::to_string(body.size()) + "\r\n", keep_alive_);
    bytes += body;
    s.queue_write(std::move(bytes), true, !keep_alive_);
  });
}

void SessionResponder::start_stream(std::string content_type, HeaderList extra) {
  post([this, ct = std::move(content_type), extra = std::move(extra)](Session& s) mutable {
    if (finished_ || streaming_ || disconnected_) return;
    streaming_ = true;
    extra.emplace_back("Cache-Control", "no-cache");
    extra.emplace_back("X-Accel-Buffering", "no");
    s.queue_write(status_line_and_headers(200, ct, extra, "Transfer-Encoding: chunked\r\n", keep_alive_), false,
                  false);
  });
}

void SessionResponder::write(std::string chunk) {
  if (chunk.empty()) return;  // an empty chunk would end the body
  post([this, chunk = std::move(chunk)](Session& s) {
    if (!streaming_ || finished_ || disconnected_) return;
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
    s.queue_write(std::string(size) + chunk + "\r\n", false, false);
  });
}

void SessionResponder::end() {
  post([this](Session& s) {
    if (!streaming_ || finished_) return;
    finished_ = true;
    if (disconnected_) return;
    s.queue_write("0\r\n\r\n", true, !keep_alive_);
  });
}

void SessionResponder::on_disconnect(std::function<void()> f) {
  bool run_now = false;
  {
    std::lock_guard lk(mu_);
    if (disconnected_ && !disconnect_fired_) {
      disconnect_fired_ = true;
      run_now = true;
    } else {
      on_disconnect_ = std::move(f);
    }
  }
  if (run_now) f();
}

void SessionResponder::mark_disconnected() {
  if (finished_ && !streaming_) return;  // the response is out; nothing to cancel
  std::function<void()> f;
  {
    std::lock_guard lk(mu_);
    if (disconnected_) return;
    disconnected_ = true;
    if (!disconnect_fired_ && on_disconnect_) {
      disconnect_fired_ = true;
      f = std::move(on_disconnect_);
    }
  }
  if (f) f();
}

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(const HttpServerOptions& options, Dispatch dispatch)
      : options_(options), dispatch_(std::move(dispatch)), acceptor_(ioc_) {}
  ~HttpServerImpl() override { stop(); }

  Status listen() {
    beast::error_code ec;
    const auto address = asio::ip::make_address(options_.host, ec);
    if (ec) return Error{"--host " + options_.host + ": not an IP address"};
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Error{"cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " + ec.message()};
    }
    port_ = acceptor_.local_endpoint().port();
    accept();
    const int n = std::max(1, options_.io_threads);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
    return Status::Ok();
  }

  int port() const override { return port_; }
  int64_t open_connections() const override { return n_open_; }

  void stop() override {
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    asio::post(ioc_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
    ioc_.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    stopped_cv_.notify_all();
  }

  void wait() override {
    std::unique_lock lk(mu_);
    stopped_cv_.wait(lk, [&] { return stopped_; });
  }

 private:
  void accept() {
    acceptor_.async_accept(asio::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted) return;
      } else {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(socket), options_, dispatch_, n_open_)->start();
      }
      accept();
    });
  }

  HttpServerOptions options_;
  Dispatch dispatch_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> n_open_{0};
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable stopped_cv_;
  bool stopped_ = false;
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, Dispatch dispatch) {
  auto server = std::make_unique<HttpServerImpl>(options, std::move(dispatch));
  RILL_TRY(server->listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace rill::server
