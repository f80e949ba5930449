#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio.hpp>

#include "server/errors.h"
#include "server/http_session.h"

namespace rill::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// The handler threads: complete requests wait here for a free thread. The
// queue holds at most one request per connection (a connection reads its
// next request only after the response), so max_connections bounds it.
class HandlerPool {
 public:
  void start(int n, HttpServer::Dispatch dispatch) {
    dispatch_ = std::move(dispatch);
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { run(); });
  }
  void submit(HttpRequest req, std::shared_ptr<Responder> res) {
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      tasks_.push_back({std::move(req), std::move(res)});
    }
    cv_.notify_one();
  }
  // Joins the threads; queued requests are dropped.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopped_ = true;
      tasks_.clear();
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  struct Task {
    HttpRequest req;
    std::shared_ptr<Responder> res;
  };
  void run() {
    for (;;) {
      Task task;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopped_ || !tasks_.empty(); });
        if (stopped_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        dispatch_(task.req, task.res);
      } catch (const std::exception& e) {
        spdlog::warn("http: handler for {} {} threw: {}", task.req.method, task.req.path, e.what());
        send_error(*task.res, ApiError{500, std::string("internal error: ") + e.what(), "server_error"});
      } catch (...) {
        send_error(*task.res, ApiError{500, "internal error", "server_error"});
      }
    }
  }

  HttpServer::Dispatch dispatch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

int default_max_connections() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 4096;
  return static_cast<int>(std::clamp<rlim_t>(r.rlim_cur > 128 ? r.rlim_cur - 64 : r.rlim_cur / 2, 1, 4096));
}

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system ||
         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(const HttpServerOptions& options, Dispatch dispatch)
      : shared_(std::make_shared<ServerShared>()),
        accept_strand_(asio::make_strand(shared_->ioc)),
        acceptor_(accept_strand_),
        backoff_timer_(accept_strand_) {
    shared_->options = options;
    if (shared_->options.max_connections <= 0) shared_->options.max_connections = default_max_connections();
    shared_->limits = {options.max_header_bytes, options.max_body_bytes};
    shared_->submit = [this](HttpRequest req, std::shared_ptr<Responder> res) {
      pool_.submit(std::move(req), std::move(res));
    };
    pool_.start(options.handler_threads, std::move(dispatch));
  }
  ~HttpServerImpl() override { stop(); }

  Status listen() {
    const HttpServerOptions& o = shared_->options;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(o.host, ec);
    if (ec) return Error{"--host " + o.host + ": not an IP address"};
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Error{"cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message()};
    port_ = acceptor_.local_endpoint().port();
    accept();
    for (int i = 0; i < std::max(1, o.io_threads); ++i) threads_.emplace_back([this] { run_io(); });
    return Status::Ok();
  }

  int port() const override { return port_; }
  int64_t open_connections() const override { return shared_->n_open; }
  int64_t active_responses() const override { return shared_->n_active; }

  HttpServerCounters counters() const override {
    const auto& c = shared_->counters;
    return {c.rejected_at_capacity, c.accept_backoffs,     c.request_timeouts,
            c.idle_closes,          c.abandoned_responses, c.connection_errors};
  }

  void stop_accepting() override {
    if (shared_->draining.exchange(true)) return;
    asio::post(accept_strand_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      backoff_timer_.cancel();
    });
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard lk(shared_->sessions_mu);
      for (auto& [key, weak] : shared_->sessions) {
        if (auto s = weak.lock()) open.push_back(std::move(s));
      }
    }
    for (auto& s : open) drain_session(s);
  }

  void stop() override {
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    shared_->draining = true;
    asio::post(accept_strand_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    shared_->ioc.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    pool_.stop();
    // Pending I/O handlers hold their Sessions, which hold the io_context
    // (ServerShared): close every session and run the aborted handlers out,
    // so that cycle breaks. Sessions a Responder still holds (a handler, the
    // engine) go when it lets go, the io_context with the last of them.
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lk(shared_->sessions_mu);
      for (auto& [key, weak] : shared_->sessions) {
        if (auto session = weak.lock()) live.push_back(std::move(session));
      }
    }
    for (const auto& session : live) close_session(session);
    live.clear();
    shared_->ioc.restart();
    shared_->ioc.run_for(std::chrono::seconds(5));
    stopped_cv_.notify_all();
  }

  void wait() override {
    std::unique_lock lk(mu_);
    stopped_cv_.wait(lk, [&] { return stopped_; });
  }

 private:
  // An exception that escapes a handler must not end the I/O thread (nor the
  // process): log it and keep running. Sessions catch their own; this is
  // the backstop.
  void run_io() {
    for (;;) {
      try {
        shared_->ioc.run();
        return;
      } catch (const std::exception& e) {
        ++shared_->counters.connection_errors;
        spdlog::error("http: an I/O handler threw (the I/O thread continues): {}", e.what());
      }
    }
  }

  void accept() {
    acceptor_.async_accept(asio::make_strand(shared_->ioc), [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        if (out_of_descriptors(ec)) return back_off(ec);
        spdlog::warn("http: accept failed: {}", ec.message());
        return accept();
      }
      if (fd_exhausted_) {
        fd_exhausted_ = false;
        spdlog::info("http: accepting connections again");
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (shared_->n_open >= shared_->options.max_connections) {
        ++shared_->counters.rejected_at_capacity;
        start_session(std::move(socket), shared_, 503,
                      "too many connections (the limit is " + std::to_string(shared_->options.max_connections) +
                          "); retry later");
      } else {
        start_session(std::move(socket), shared_);
      }
      accept();
    });
  }

  // accept() fails at once, and again, while the process has no free file
  // descriptor: wait instead of spinning a core on it.
  void back_off(const boost::system::error_code& ec) {
    ++shared_->counters.accept_backoffs;
    if (!fd_exhausted_) {
      fd_exhausted_ = true;
      spdlog::warn("http: accept failed ({}); retrying every {} ms until descriptors free up", ec.message(),
                   shared_->options.accept_backoff_ms);
    }
    backoff_timer_.expires_after(std::chrono::milliseconds(std::max(1, shared_->options.accept_backoff_ms)));
    backoff_timer_.async_wait([this](boost::system::error_code wait_ec) {
      if (wait_ec || !acceptor_.is_open()) return;
      accept();
    });
  }

  std::shared_ptr<ServerShared> shared_;
  asio::strand<asio::io_context::executor_type> accept_strand_;  // the acceptor and its back-off timer
  tcp::acceptor acceptor_;
  asio::steady_timer backoff_timer_;
  bool fd_exhausted_ = false;  // accept_strand_ only
  HandlerPool pool_;
  std::vector<std::thread> threads_;
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
