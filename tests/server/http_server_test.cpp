// HttpServer over real sockets: responses, keep-alive, chunked streams,
// limits (413, 431), malformed framing (400), disconnect notification, and
// the hardening of issue 15: nothing a client sends ends the process or
// stalls other connections; timeouts, the connection cap, fd exhaustion,
// slow readers, pipelined disconnects, HEAD, HTTP/1.0, 100-continue and the
// graceful-shutdown primitives.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>

namespace rill::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// A blocking client connection with bounded reads.
class Conn {
 public:
  explicit Conn(int port) : s_(io_) {
    s_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
    s_.non_blocking(true);
  }
  void send(const std::string& bytes) {
    s_.non_blocking(false);
    asio::write(s_, asio::buffer(bytes));
    s_.non_blocking(true);
  }
  // Reads until `until` appears (empty: until the server closes) or the
  // timeout; everything read so far stays in out().
  const std::string& read(const std::string& until = "", std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[8192];
    while (!closed_ && std::chrono::steady_clock::now() < deadline) {
      if (!until.empty() && out_.find(until) != std::string::npos) break;
      boost::system::error_code ec;
      const size_t n = s_.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(2ms);
        continue;
      }
      if (ec) {
        closed_ = true;
        break;
      }
      out_.append(buf, n);
    }
    return out_;
  }
  bool closed() const { return closed_; }
  const std::string& out() const { return out_; }
  tcp::socket& socket() { return s_; }
  void close() {
    boost::system::error_code ec;
    s_.close(ec);
  }

 private:
  asio::io_context io_;
  tcp::socket s_;
  std::string out_;
  bool closed_ = false;
};

std::string exchange(int port, const std::string& bytes, const std::string& until = "") {
  Conn c(port);
  c.send(bytes);
  return c.read(until);
}

struct Server {
  explicit Server(HttpServer::Dispatch d, size_t max_body = 1024, HttpServerOptions o = {}) {
    o.port = 0;
    o.max_body_bytes = max_body;
    auto s = HttpServer::start(o, std::move(d));
    EXPECT_TRUE(s.ok()) << s.error().message;
    server = std::move(s).value();
  }
  int port() const { return server->port(); }
  std::unique_ptr<HttpServer> server;
};

void echo(const HttpRequest& req, std::shared_ptr<Responder> res) {
  res->send(200, "text/plain",
            req.method + " " + req.path + " q=" + req.query + " body=" + req.body + " h=" + req.header("x-test"));
}

// Waits (bounded) for a condition another thread makes true.
template <class F>
bool eventually(F f, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!f()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Responders a test keeps past its handler, released before the server.
struct Held {
  std::mutex mu;
  std::vector<std::shared_ptr<Responder>> list;
  void add(std::shared_ptr<Responder> r) {
    std::lock_guard lk(mu);
    list.push_back(std::move(r));
  }
  std::shared_ptr<Responder> at(size_t i) {
    std::lock_guard lk(mu);
    return i < list.size() ? list[i] : nullptr;
  }
  size_t size() {
    std::lock_guard lk(mu);
    return list.size();
  }
};

TEST(HttpServer, AnswersAndKeepsTheConnectionAlive) {
  Server srv(echo);
  const std::string two =
      "GET /a?x=1 HTTP/1.1\r\nHost: x\r\nX-Test: yes\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  const std::string out = exchange(srv.port(), two, "body=hello");
  EXPECT_NE(out.find("GET /a q=x=1 body= h=yes"), std::string::npos) << out;
  EXPECT_NE(out.find("POST /b q= body=hello h="), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 200 OK"), std::string::npos);
}

TEST(HttpServer, StreamsChunks) {
  Server srv([](const HttpRequest&, std::shared_ptr<Responder> res) {
    std::thread([res] {
      res->start_stream("text/event-stream");
      for (int i = 0; i < 3; ++i) res->write("data: " + std::to_string(i) + "\n\n");
      res->end();
    }).detach();
  });
  const std::string out = exchange(srv.port(), "GET /s HTTP/1.1\r\nHost: x\r\n\r\n", "0\r\n\r\n");
  EXPECT_NE(out.find("Transfer-Encoding: chunked"), std::string::npos) << out;
  EXPECT_NE(out.find("9\r\ndata: 0\n\n\r\n"), std::string::npos) << out;
  EXPECT_NE(out.find("data: 2"), std::string::npos) << out;
  EXPECT_NE(out.find("0\r\n\r\n"), std::string::npos) << out;
}

TEST(HttpServer, OversizedBodyIs413AndGarbageIs400) {
  Server srv(echo, 16);
  std::string big = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'a');
  const std::string out = exchange(srv.port(), big);
  EXPECT_NE(out.find("HTTP/1.1 413"), std::string::npos) << out;
  EXPECT_NE(out.find("\"invalid_request_error\""), std::string::npos) << out;
  const std::string bad = exchange(srv.port(), "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_NE(bad.find("HTTP/1.1 400"), std::string::npos) << bad;
}

// Issue 15: a >= 64 KiB trailer field threw out of the I/O loop and ended
// the process; oversized headers were a 413 about the body.
TEST(HttpServer, HugeTrailerAndHeaderAre431AndTheServerLives) {
  Server srv(echo);
  const std::string trailer =
      "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n0\r\nX-Trailer: " +
      std::string(70 << 10, 't') + "\r\n\r\n";
  const std::string out = exchange(srv.port(), trailer);
  EXPECT_NE(out.find("HTTP/1.1 431"), std::string::npos) << out.substr(0, 200);
  const std::string header = "GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70 << 10, 'h') + "\r\n\r\n";
  const std::string out2 = exchange(srv.port(), header);
  EXPECT_NE(out2.find("HTTP/1.1 431"), std::string::npos) << out2.substr(0, 200);
  EXPECT_NE(out2.find("header"), std::string::npos) << out2.substr(0, 300);
  const std::string ok = exchange(srv.port(), "GET /after HTTP/1.1\r\nHost: x\r\n\r\n", "body=");
  EXPECT_NE(ok.find("GET /after"), std::string::npos) << ok;
}

TEST(HttpServer, BadTransferEncodingIs400) {
  Server srv(echo);
  const std::string x = exchange(
      srv.port(), "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_NE(x.find("HTTP/1.1 400"), std::string::npos) << x;
  const std::string x2 = exchange(srv.port(), "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n");
  EXPECT_NE(x2.find("HTTP/1.1 400"), std::string::npos) << x2;
  const std::string both = exchange(
      srv.port(),
      "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_NE(both.find("HTTP/1.1 400"), std::string::npos) << both;
  const std::string chunked = exchange(
      srv.port(), "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "body=");
  EXPECT_NE(chunked.find("body=abc"), std::string::npos) << chunked;
}

TEST(HttpServer, ExpectContinueIsAnsweredBeforeTheBody) {
  Server srv(echo);
  Conn c(srv.port());
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  c.read("100 Continue", 5s);
  ASSERT_NE(c.out().find("HTTP/1.1 100 Continue\r\n\r\n"), std::string::npos) << c.out();
  c.send("hello");
  c.read("body=hello");
  EXPECT_NE(c.out().find("HTTP/1.1 200"), std::string::npos) << c.out();
  // A body that is too large is refused at once, without a 100.
  Conn big(srv.port());
  big.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 999999\r\n\r\n");
  big.read();
  EXPECT_EQ(big.out().find("100 Continue"), std::string::npos) << big.out();
  EXPECT_NE(big.out().find("HTTP/1.1 413"), std::string::npos) << big.out();
}

TEST(HttpServer, HeadGetsHeadersOnly) {
  Server srv([](const HttpRequest&, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "twelve bytes"); });
  Conn c(srv.port());
  c.send("HEAD /x HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  c.read("twelve bytes");
  const std::string& out = c.out();
  const size_t first = out.find("HTTP/1.1 200");
  const size_t second = out.find("HTTP/1.1 200", first + 1);
  ASSERT_NE(second, std::string::npos) << out;
  const std::string head = out.substr(0, second);
  EXPECT_NE(head.find("Content-Length: 12\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.find("twelve"), std::string::npos) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
}

TEST(HttpServer, Http10StreamsAreUnchunkedAndCloseDelimited) {
  Server srv([](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->start_stream("text/event-stream");
    res->write("data: a\n\n");
    res->write("data: b\n\n");
    res->end();
  });
  const std::string out = exchange(srv.port(), "GET /s HTTP/1.0\r\n\r\n");  // reads until close
  EXPECT_EQ(out.find("Transfer-Encoding"), std::string::npos) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  EXPECT_TRUE(out.ends_with("\r\n\r\ndata: a\n\ndata: b\n\n")) << out;
}

TEST(HttpServer, ClientDisconnectIsReported) {
  std::atomic<bool> gone{false};
  Held held;
  Server srv([&](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->on_disconnect([&] { gone = true; });
    res->start_stream("text/event-stream");
    res->write("data: hi\n\n");
    held.add(res);  // never ends: the client must go away
  });
  exchange(srv.port(), "GET /s HTTP/1.1\r\nHost: x\r\n\r\n", "data: hi");  // closes the socket after
  EXPECT_TRUE(eventually([&] { return gone.load(); }));
  ASSERT_TRUE(held.at(0));
  EXPECT_TRUE(held.at(0)->disconnected());
  held.at(0)->write("data: ignored\n\n");  // writes after a disconnect are dropped, not crashes
  held.at(0)->end();
}

// Issue 15: after a pipelined second request was parked no read was posted,
// so the first request's generation never learned the client had gone.
TEST(HttpServer, PipelinedRequestDoesNotHideTheDisconnect) {
  std::atomic<bool> gone{false};
  Held held;
  Server srv([&](const HttpRequest& req, std::shared_ptr<Responder> res) {
    if (req.path == "/first") res->on_disconnect([&] { gone = true; });
    res->start_stream("text/event-stream");
    res->write("data: " + req.path + "\n\n");
    held.add(res);
  });
  {
    Conn c(srv.port());
    c.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n");
    c.read("data: /first");
  }  // closed with the second request still queued
  EXPECT_TRUE(eventually([&] { return gone.load(); }, 5s));
  EXPECT_EQ(held.size(), 1u);  // the second request was never dispatched
}

// Issue 15: dispatch ran on the one I/O thread, so one slow request (a huge
// JSON body, a long template) stalled every other connection.
TEST(HttpServer, SlowHandlerDoesNotDelayOtherConnections) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Server srv([&](const HttpRequest& req, std::shared_ptr<Responder> res) {
    if (req.path == "/slow") released.wait_for(20s);
    res->send(200, "text/plain", "done " + req.path);
  });
  Conn slow(srv.port());
  slow.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  std::this_thread::sleep_for(50ms);  // let /slow reach its handler first
  const std::string health = exchange(srv.port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "done /health");
  const bool answered = health.find("done /health") != std::string::npos;
  release.set_value();
  EXPECT_TRUE(answered) << "/health waited for /slow";
  slow.read("done /slow");
  EXPECT_NE(slow.out().find("done /slow"), std::string::npos);
}

TEST(HttpServer, SlowHeaderAndBodyGet408AndIdleConnectionsClose) {
  HttpServerOptions o;
  o.header_timeout_s = 0.2;
  o.body_timeout_s = 0.2;
  o.idle_timeout_s = 0.2;
  Server srv(echo, 1024, o);
  Conn partial(srv.port());
  partial.send("GET /x HTTP/1.1\r\nHost: x\r\n");  // never finishes the header
  partial.read();
  EXPECT_TRUE(partial.closed());
  EXPECT_NE(partial.out().find("HTTP/1.1 408"), std::string::npos) << partial.out();

  Conn body(srv.port());
  body.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
  body.read();
  EXPECT_TRUE(body.closed());
  EXPECT_NE(body.out().find("HTTP/1.1 408"), std::string::npos) << body.out();

  Conn idle(srv.port());
  idle.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  idle.read();  // the answer, then the close once idle
  EXPECT_TRUE(idle.closed());
  EXPECT_NE(idle.out().find("HTTP/1.1 200"), std::string::npos) << idle.out();
  const HttpServerCounters n = srv.server->counters();
  EXPECT_EQ(n.request_timeouts, 2);
  EXPECT_EQ(n.idle_closes, 1);
}

TEST(HttpServer, ConnectionsBeyondTheCapGet503) {
  HttpServerOptions o;
  o.max_connections = 1;
  Server srv(echo, 1024, o);
  Conn first(srv.port());
  first.send("GET /one HTTP/1.1\r\nHost: x\r\n\r\n");
  first.read("body=");
  Conn second(srv.port());
  second.read();
  EXPECT_TRUE(second.closed());
  EXPECT_NE(second.out().find("HTTP/1.1 503"), std::string::npos) << second.out();
  EXPECT_NE(second.out().find("Connection: close"), std::string::npos) << second.out();
  EXPECT_NE(second.out().find("\"error\""), std::string::npos) << second.out();
  EXPECT_EQ(srv.server->counters().rejected_at_capacity, 1);
  first.close();
  EXPECT_TRUE(eventually([&] { return srv.server->open_connections() == 0; }));
  const std::string ok = exchange(srv.port(), "GET /two HTTP/1.1\r\nHost: x\r\n\r\n", "body=");
  EXPECT_NE(ok.find("GET /two"), std::string::npos) << ok;
}

// Issue 15: at the fd limit accept() failed at once, forever: a core spun.
// UBSan checks a virtual call's vptr through a pipe: with every descriptor
// taken it cannot, and reports the call (any virtual call, in the server or
// here) as undefined. The uninstrumented build runs this test.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define RILL_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define RILL_SANITIZED 1
#endif

TEST(HttpServer, AcceptBacksOffWhenOutOfDescriptors) {
#ifdef RILL_SANITIZED
  GTEST_SKIP() << "needs descriptors to be exhausted, which UBSan's vptr check cannot work under";
#endif
  HttpServerOptions o;
  o.accept_backoff_ms = 100;
  Server srv(echo, 1024, o);
  // Client sockets made while fds are free; then no new fd can be made, so
  // the server's accept() fails with EMFILE when they connect.
  std::vector<std::unique_ptr<asio::io_context>> ios;
  std::vector<tcp::socket> clients;
  for (int i = 0; i < 2; ++i) {
    ios.push_back(std::make_unique<asio::io_context>());
    clients.emplace_back(*ios.back());
    clients.back().open(tcp::v4());
  }
  // No virtual call while descriptors are out: UBSan's vptr check needs one.
  const auto endpoint = tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(srv.port()));
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int probe = dup(2);
  ASSERT_GE(probe, 0);
  close(probe);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(probe);  // the lowest free fd: nothing new fits
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  for (auto& c : clients) {
    c.connect(endpoint);
  }
  std::this_thread::sleep_for(500ms);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  const int64_t backoffs = srv.server->counters().accept_backoffs;
  EXPECT_GE(backoffs, 1);
  EXPECT_LE(backoffs, 20) << "accept() retried without waiting";
  // Once descriptors are free again the waiting connections are served.
  asio::write(clients[0], asio::buffer(std::string("GET /back HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string got(256, '\0');
  boost::system::error_code ec;
  const size_t n = clients[0].read_some(asio::buffer(got), ec);
  EXPECT_NE(got.substr(0, n).find("HTTP/1.1 200"), std::string::npos) << got.substr(0, n);
}

// Issue 15: a client that stops reading made the server buffer its stream
// without bound; now the response is abandoned and on_disconnect fires.
TEST(HttpServer, ClientThatStopsReadingIsAbandoned) {
  HttpServerOptions o;
  o.max_write_queue_bytes = 256 << 10;
  o.send_timeout_s = 30;
  std::atomic<bool> gone{false};
  std::atomic<int64_t> written{0};
  std::thread writer;
  Held held;
  Server srv(
      [&](const HttpRequest&, std::shared_ptr<Responder> res) {
        res->on_disconnect([&] { gone = true; });
        res->start_stream("text/event-stream");
        held.add(res);
        writer = std::thread([res, &written, &gone] {
          const std::string chunk(64 << 10, 'x');
          while (!gone && written < (int64_t{512} << 20)) {
            res->write(chunk);
            written += static_cast<int64_t>(chunk.size());
            std::this_thread::sleep_for(100us);
          }
        });
      },
      1024, o);
  Conn c(srv.port());
  boost::system::error_code ec;
  c.socket().set_option(asio::socket_base::receive_buffer_size(4096), ec);
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");  // and never reads
  EXPECT_TRUE(eventually([&] { return gone.load(); }, 30s));
  if (writer.joinable()) writer.join();
  EXPECT_LT(written.load(), int64_t{512} << 20);
  EXPECT_GE(srv.server->counters().abandoned_responses, 1);
}

TEST(HttpServer, SendTimeoutAbandonsAStalledResponse) {
  HttpServerOptions o;
  o.send_timeout_s = 0.3;
  o.max_write_queue_bytes = size_t{1} << 30;
  std::atomic<bool> gone{false};
  Held held;
  Server srv(
      [&](const HttpRequest&, std::shared_ptr<Responder> res) {
        res->on_disconnect([&] { gone = true; });
        res->start_stream("text/event-stream");
        res->write(std::string(64 << 20, 'x'));  // more than the socket buffers hold
        held.add(res);
      },
      1024, o);
  Conn c(srv.port());
  boost::system::error_code ec;
  c.socket().set_option(asio::socket_base::receive_buffer_size(4096), ec);
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");  // and never reads
  EXPECT_TRUE(eventually([&] { return gone.load(); }, 20s));
  EXPECT_EQ(srv.server->counters().abandoned_responses, 1);
}

TEST(HttpServer, StopAcceptingDrainsGracefully) {
  Held held;
  Server srv([&](const HttpRequest& req, std::shared_ptr<Responder> res) {
    if (req.path == "/stream") {
      res->start_stream("text/event-stream");
      res->write("data: start\n\n");
      held.add(res);
      return;
    }
    res->send(200, "text/plain", "done " + req.path);
  });
  Conn idle(srv.port());
  idle.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  idle.read("done /a");
  Conn streaming(srv.port());
  streaming.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  streaming.read("data: start");
  ASSERT_TRUE(eventually([&] { return srv.server->active_responses() == 1; }));

  srv.server->stop_accepting();
  idle.read();  // the idle keep-alive connection closes
  EXPECT_TRUE(idle.closed());
  boost::system::error_code ec;
  asio::io_context io;
  tcp::socket late(io);
  late.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(srv.port())), ec);
  EXPECT_TRUE(ec) << "the listener is still open";

  // The stream in flight continues; a request after it gets 503 and the close.
  streaming.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(held.at(0));
  held.at(0)->write("data: more\n\n");
  held.at(0)->end();
  streaming.read();
  EXPECT_TRUE(streaming.closed());
  EXPECT_NE(streaming.out().find("data: more"), std::string::npos) << streaming.out();
  EXPECT_NE(streaming.out().find("HTTP/1.1 503"), std::string::npos) << streaming.out();
  EXPECT_EQ(srv.server->active_responses(), 0);
}

}  // namespace
}  // namespace rill::server
