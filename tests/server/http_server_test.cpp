// HttpServer over real sockets: responses, keep-alive, chunked streams,
// limits (413), malformed requests (400) and disconnect notification.
#include "server/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <boost/asio.hpp>

namespace rill::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Sends raw bytes and reads until the server closes or `until` appears.
std::string exchange(int port, const std::string& bytes, const std::string& until = "",
                     std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
  asio::write(s, asio::buffer(bytes));
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  s.non_blocking(true);
  while (std::chrono::steady_clock::now() < deadline) {
    boost::system::error_code ec;
    const size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec == asio::error::would_block) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (ec) break;
    out.append(buf, n);
    if (!until.empty() && out.find(until) != std::string::npos) break;
  }
  return out;
}

struct Server {
  explicit Server(HttpServer::Dispatch d, size_t max_body = 1024) {
    HttpServerOptions o;
    o.port = 0;
    o.max_body_bytes = max_body;
    auto s = HttpServer::start(o, std::move(d));
    EXPECT_TRUE(s.ok()) << s.error().message;
    server = std::move(s).value();
  }
  int port() const { return server->port(); }
  std::unique_ptr<HttpServer> server;
};

TEST(HttpServer, AnswersAndKeepsTheConnectionAlive) {
  Server srv([](const HttpRequest& req, std::shared_ptr<Responder> res) {
    res->send(200, "text/plain", req.method + " " + req.path + " q=" + req.query + " body=" + req.body +
                                     " h=" + req.header("x-test"));
  });
  const std::string two = "GET /a?x=1 HTTP/1.1\r\nHost: x\r\nX-Test: yes\r\n\r\n"
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
  Server srv([](const HttpRequest&, std::shared_ptr<Responder> res) { res->send(200, "text/plain", "ok"); }, 16);
  std::string big = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'a');
  const std::string out = exchange(srv.port(), big);
  EXPECT_NE(out.find("HTTP/1.1 413"), std::string::npos) << out;
  EXPECT_NE(out.find("\"invalid_request_error\""), std::string::npos) << out;
  const std::string bad = exchange(srv.port(), "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_NE(bad.find("HTTP/1.1 400"), std::string::npos) << bad;
}

TEST(HttpServer, ClientDisconnectIsReported) {
  std::atomic<bool> gone{false};
  std::shared_ptr<Responder> held;
  std::mutex mu;
  Server srv([&](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->on_disconnect([&] { gone = true; });
    res->start_stream("text/event-stream");
    res->write("data: hi\n\n");
    std::lock_guard lk(mu);
    held = res;  // never ends: the client must go away
  });
  exchange(srv.port(), "GET /s HTTP/1.1\r\nHost: x\r\n\r\n", "data: hi");  // closes the socket after
  for (int i = 0; i < 200 && !gone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(gone);
  std::lock_guard lk(mu);
  ASSERT_TRUE(held);
  EXPECT_TRUE(held->disconnected());
  held->write("data: ignored\n\n");  // writes after a disconnect are dropped, not crashes
  held->end();
}

}  // namespace
}  // namespace rill::server
