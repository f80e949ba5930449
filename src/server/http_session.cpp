#include "server/http_session.h"

#include <poll.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>
#include <boost/asio.hpp>
#include <boost/beast/http/status.hpp>

#include "server/errors.h"

namespace rill::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(0.001, seconds) * 1000));
}

std::string status_line_and_headers(int status, const std::string& content_type, const HeaderList& extra,
                                    const std::string& framing, bool keep_alive) {
  std::string s = "HTTP/1.1 " + std::to_string(status) + " " +
                  std::string(http::obsolete_reason(static_cast<http::status>(status))) + "\r\n";
  s += "Content-Type: " + content_type + "\r\n";
  s += framing;
  for (const auto& [k, v] : extra) s += k + ": " + v + "\r\n";
  s += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  s += "\r\n";
  return s;
}

// How the current request wants its response framed.
struct ResponseShape {
  bool keep_alive = true;  // the client asked to keep the connection
  bool chunked = true;     // HTTP/1.1: streams are chunked; 1.0: delimited by close
  bool head = false;       // HEAD: headers only
};

// Time after a final error reply during which the client's remaining bytes
// are read and dropped, so closing does not reset the connection (and lose
// the reply) while the client is still sending.
constexpr auto kLingerTime = std::chrono::milliseconds(500);
constexpr size_t kLingerBytes = 1 << 20;

}  // namespace

class SessionResponder;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerShared> shared)
      : shared_(std::move(shared)),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()),
        hangup_timer_(socket_.get_executor()) {
    ++shared_->n_open;
  }
  ~Session() {
    {
      std::lock_guard lk(shared_->sessions_mu);
      shared_->sessions.erase(this);
    }
    --shared_->n_open;
  }

  void start(int reject_status, std::string reject_message) {
    {
      std::lock_guard lk(shared_->sessions_mu);
      shared_->sessions[this] = weak_from_this();
    }
    asio::dispatch(socket_.get_executor(), [self = shared_from_this(), reject_status, m = std::move(reject_message)] {
      self->guard([&] {
        if (reject_status != 0) {
          self->reject({reject_status, m});
        } else {
          self->read_request();
        }
      });
    });
  }

  // Closes the connection on its strand (hard stop).
  void close_now() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  void drain() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->guard([&] {
        if (self->closed_) return;
        const bool no_request =
            self->phase_ == Phase::Idle || (self->phase_ == Phase::Header && self->buffer_.size() == 0);
        if (no_request && !self->bytes_waiting()) {
          self->close();
        }
      });
    });
  }

  // --- for SessionResponder (strand only) ---
  auto executor() { return socket_.get_executor(); }
  bool keep_alive_now(bool requested) const { return requested && !shared_->draining; }
  // Queues bytes for the client. `ends_response`: the last bytes of the
  // current response; `close_after`: close the connection once written.
  void queue_write(std::string bytes, bool ends_response, bool close_after);
  const HttpServerOptions& options() const { return shared_->options; }

 private:
  enum class Phase { Idle, Header, Body, Responding, Rejecting, Lingering, Closed };
  struct Write {
    std::string bytes;
    size_t offset = 0;
    bool ends_response;
    bool close_after;
  };

  // Runs `f`; an exception closes this connection only.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      ++shared_->counters.connection_errors;
      spdlog::warn("http: closing a connection after an error in its I/O: {}", e.what());
      close();
    }
  }

  // Bytes the client sent that the kernel holds unread.
  bool bytes_waiting() {
    beast::error_code ec;
    return socket_.available(ec) > 0 && !ec;
  }
  void read_request();
  void parse();
  void read_more();
  void on_read(beast::error_code ec, size_t n);
  void on_request();
  void reject(const FramingError& err);
  void arm_read_timer(double seconds);
  void on_read_timeout();
  void watch_hangup();
  void write_next();
  void on_write(beast::error_code ec, size_t n);
  void finish_response();
  void linger_close();
  void drain_input();
  void close();

  // First member, so destroyed last: it owns the io_context, whose services
  // the socket and timers below need when they are destroyed (a Session can
  // outlive the HttpServer, held by a Responder in a handler or the engine).
  std::shared_ptr<ServerShared> shared_;
  tcp::socket socket_;
  asio::steady_timer read_timer_, write_timer_, hangup_timer_;
  uint64_t read_seq_ = 0, write_seq_ = 0;  // a timer handler from an older arming is stale
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  bool head_checked_ = false;
  Phase phase_ = Phase::Header;
  int64_t n_requests_ = 0;
  std::shared_ptr<SessionResponder> current_;
  bool response_active_ = false;  // current_ dispatched and not finished (counted in n_active)
  std::deque<Write> writes_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  size_t lingered_bytes_ = 0;
  char scratch_[4096];
};

// The Responder of one request on one Session. Every call posts to the
// session's strand, so calls from any thread keep their order.
class SessionResponder final : public Responder, public std::enable_shared_from_this<SessionResponder> {
 public:
  SessionResponder(std::shared_ptr<Session> session, ResponseShape shape)
      : session_(std::move(session)), shape_(shape) {}

  void send(int status, std::string content_type, std::string body, HeaderList extra) override {
    post([this, status, ct = std::move(content_type), body = std::move(body), extra = std::move(extra)](Session& s) {
      if (finished_ || streaming_ || disconnected_) return;
      finished_ = true;
      const bool keep_alive = s.keep_alive_now(shape_.keep_alive);
      std::string bytes = status_line_and_headers(
          status, ct, extra, "Content-Length: " + std::to_string(body.size()) + "\r\n", keep_alive);
      if (!shape_.head) bytes += body;
      s.queue_write(std::move(bytes), true, !keep_alive);
    });
  }

  void start_stream(std::string content_type, HeaderList extra) override {
    post([this, ct = std::move(content_type), extra = std::move(extra)](Session& s) mutable {
      if (finished_ || streaming_ || disconnected_) return;
      streaming_ = true;
      // HTTP/1.0 has no chunked coding: the body ends when the connection does.
      stream_keep_alive_ = shape_.chunked && s.keep_alive_now(shape_.keep_alive);
      extra.emplace_back("Cache-Control", "no-cache");
      extra.emplace_back("X-Accel-Buffering", "no");
      s.queue_write(status_line_and_headers(200, ct, extra, shape_.chunked ? "Transfer-Encoding: chunked\r\n" : "",
                                            stream_keep_alive_),
                    false, false);
    });
  }

  void write(std::string chunk) override {
    if (chunk.empty()) return;  // an empty chunk would end the body
    post([this, chunk = std::move(chunk)](Session& s) {
      if (!streaming_ || finished_ || disconnected_ || shape_.head) return;
      if (!shape_.chunked) return s.queue_write(chunk, false, false);
      char size[20];
      std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
      s.queue_write(std::string(size) + chunk + "\r\n", false, false);
    });
  }

  void end() override {
    post([this](Session& s) {
      if (!streaming_ || finished_) return;
      finished_ = true;
      if (disconnected_) return;
      s.queue_write(shape_.chunked && !shape_.head ? "0\r\n\r\n" : "", true, !stream_keep_alive_);
    });
  }

  void on_disconnect(std::function<void()> f) override {
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

  bool disconnected() const override { return disconnected_; }

  // Strand only: the response will not reach the client; on_disconnect runs
  // unless the whole response was already handed over.
  void mark_disconnected() {
    if (finished_) return;  // the response is out; nothing to cancel
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

 private:
  void post(std::function<void(Session&)> f) {
    asio::post(session_->executor(), [self = shared_from_this(), f = std::move(f)] { f(*self->session_); });
  }

  std::shared_ptr<Session> session_;
  const ResponseShape shape_;
  std::atomic<bool> disconnected_{false};
  bool finished_ = false;  // strand only: send() or end() issued
  bool streaming_ = false;
  bool stream_keep_alive_ = false;
  std::mutex mu_;
  std::function<void()> on_disconnect_;
  bool disconnect_fired_ = false;
};

void Session::read_request() {
  if (closed_) return;
  current_.reset();  // breaks the session <-> responder cycle of the last request
  // Draining: an idle connection closes; a request already sent gets 503.
  if (shared_->draining && buffer_.size() == 0 && !bytes_waiting()) return close();
  parser_.emplace();
  configure_parser(*parser_, shared_->limits);
  head_checked_ = false;
  const bool idle = n_requests_ > 0 && buffer_.size() == 0;
  phase_ = idle ? Phase::Idle : Phase::Header;
  arm_read_timer(idle ? shared_->options.idle_timeout_s : shared_->options.header_timeout_s);
  parse();
}

void Session::parse() {
  const FramingError err = feed(*parser_, buffer_, shared_->limits);
  if (!err.ok()) return reject(err);
  if (!head_checked_ && parser_->is_header_done()) {
    head_checked_ = true;
    HeadInfo info;
    const FramingError head_err = check_head(*parser_, shared_->limits, info);
    if (!head_err.ok()) return reject(head_err);
    if (!parser_->is_done()) {
      phase_ = Phase::Body;
      arm_read_timer(shared_->options.body_timeout_s);
      if (info.expect_continue && info.has_body) queue_write("HTTP/1.1 100 Continue\r\n\r\n", false, false);
    }
    return parse();  // body bytes may already be buffered
  }
  if (parser_->is_done()) return on_request();
  if (buffer_.size() >= read_buffer_limit(shared_->limits)) return reject(buffer_full_error(shared_->limits));
  read_more();
}

void Session::read_more() {
  const size_t room = read_buffer_limit(shared_->limits) - buffer_.size();
  socket_.async_read_some(
      buffer_.prepare(std::min<size_t>(room, 16 << 10)),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->guard([&] { self->on_read(ec, n); }); });
}

void Session::on_read(beast::error_code ec, size_t n) {
  if (closed_ || (phase_ != Phase::Idle && phase_ != Phase::Header && phase_ != Phase::Body)) return;
  if (ec) return close();  // the client went away; no response is in flight while reading
  buffer_.commit(n);
  if (phase_ == Phase::Idle) {
    phase_ = Phase::Header;
    arm_read_timer(shared_->options.header_timeout_s);
  }
  parse();
}

void Session::on_request() {
  ++read_seq_;
  read_timer_.cancel();
  if (shared_->draining) return reject({503, "the server is shutting down"});
  const ResponseShape shape{parser_->get().keep_alive(), parser_->get().version() >= 11,
                            parser_->get().method() == http::verb::head};
  HttpRequest req = to_http_request(parser_->release());
  parser_.reset();
  phase_ = Phase::Responding;
  ++n_requests_;
  current_ = std::make_shared<SessionResponder>(shared_from_this(), shape);
  response_active_ = true;
  ++shared_->n_active;
  watch_hangup();
  shared_->submit(std::move(req), current_);
}

void Session::reject(const FramingError& err) {
  ++read_seq_;
  read_timer_.cancel();
  phase_ = Phase::Rejecting;
  const std::string body = openai_error_body(ApiError{err.status, err.message}).dump();
  queue_write(status_line_and_headers(err.status, "application/json", {},
                                      "Content-Length: " + std::to_string(body.size()) + "\r\n", false) +
                  body,
              false, true);
}

void Session::arm_read_timer(double seconds) {
  const uint64_t seq = ++read_seq_;
  read_timer_.expires_after(ms(seconds));
  read_timer_.async_wait([self = shared_from_this(), seq](beast::error_code ec) {
    if (ec || seq != self->read_seq_ || self->closed_) return;
    self->guard([&] { self->on_read_timeout(); });
  });
}

void Session::on_read_timeout() {
  if (phase_ == Phase::Lingering) return close();
  if (phase_ == Phase::Idle) {
    ++shared_->counters.idle_closes;
    return close();
  }
  if (phase_ != Phase::Header && phase_ != Phase::Body) return;
  ++shared_->counters.request_timeouts;
  const bool header = phase_ == Phase::Header;
  beast::error_code ignored;
  socket_.cancel(ignored);  // the pending read completes as aborted and is ignored
  reject({408, header ? "request header not received within " + std::to_string(shared_->options.header_timeout_s) + " s"
                      : "request body not received within " + std::to_string(shared_->options.body_timeout_s) + " s"});
}

// While a response is in flight nothing is read (a pipelined request waits
// in the socket), so hang-up is polled: POLLRDHUP reports the client's FIN or
// reset whatever unread bytes precede it.
void Session::watch_hangup() {
  hangup_timer_.expires_after(std::chrono::milliseconds(std::max(1, shared_->options.hangup_poll_ms)));
  hangup_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->closed_ || !self->response_active_) return;
    self->guard([&] {
      pollfd p{self->socket_.native_handle(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return self->close();
      self->watch_hangup();
    });
  });
}

void Session::queue_write(std::string bytes, bool ends_response, bool close_after) {
  if (closed_) return;
  if (!writes_.empty() && queued_bytes_ + bytes.size() > shared_->options.max_write_queue_bytes) {
    // The client is not reading: give up on it rather than buffer without end.
    ++shared_->counters.abandoned_responses;
    return close();
  }
  queued_bytes_ += bytes.size();
  writes_.push_back({std::move(bytes), 0, ends_response, close_after});
  if (!writing_) write_next();
}

void Session::write_next() {
  if (writes_.empty() || closed_) {
    writing_ = false;
    ++write_seq_;
    write_timer_.cancel();
    return;
  }
  writing_ = true;
  // The send timeout restarts on every write that makes progress.
  const uint64_t seq = ++write_seq_;
  write_timer_.expires_after(ms(shared_->options.send_timeout_s));
  write_timer_.async_wait([self = shared_from_this(), seq](beast::error_code ec) {
    if (ec || seq != self->write_seq_ || self->closed_) return;
    ++self->shared_->counters.abandoned_responses;
    self->close();
  });
  const Write& w = writes_.front();
  socket_.async_write_some(
      asio::buffer(w.bytes.data() + w.offset, w.bytes.size() - w.offset),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->guard([&] { self->on_write(ec, n); }); });
}

void Session::on_write(beast::error_code ec, size_t n) {
  if (closed_) return;
  if (ec) return close();
  Write& w = writes_.front();
  w.offset += n;
  queued_bytes_ -= n;
  if (w.offset < w.bytes.size()) return write_next();
  const Write done = std::move(w);
  writes_.pop_front();
  if (done.ends_response) finish_response();
  if (done.close_after) return linger_close();
  if (done.ends_response) read_request();
  write_next();
}

void Session::finish_response() {
  if (!response_active_) return;
  response_active_ = false;
  --shared_->n_active;
  hangup_timer_.cancel();
}

void Session::linger_close() {
  finish_response();
  phase_ = Phase::Lingering;
  writes_.clear();
  queued_bytes_ = 0;
  writing_ = false;
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  const uint64_t seq = ++read_seq_;
  read_timer_.expires_after(kLingerTime);
  read_timer_.async_wait([self = shared_from_this(), seq](beast::error_code ec) {
    if (ec || seq != self->read_seq_) return;
    self->close();
  });
  drain_input();
}

void Session::drain_input() {
  socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    if (self->closed_) return;
    self->lingered_bytes_ += n;
    if (ec || self->lingered_bytes_ > kLingerBytes) return self->close();
    self->drain_input();
  });
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  phase_ = Phase::Closed;
  if (current_ && response_active_) current_->mark_disconnected();
  finish_response();
  current_.reset();
  writes_.clear();
  queued_bytes_ = 0;
  ++read_seq_;
  ++write_seq_;
  read_timer_.cancel();
  write_timer_.cancel();
  hangup_timer_.cancel();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void start_session(tcp::socket socket, std::shared_ptr<ServerShared> shared, int reject_status,
                   std::string reject_message) {
  std::make_shared<Session>(std::move(socket), std::move(shared))->start(reject_status, std::move(reject_message));
}

void drain_session(const std::shared_ptr<Session>& session) {
  session->drain();
}

void close_session(const std::shared_ptr<Session>& session) {
  session->close_now();
}

}  // namespace rill::server
