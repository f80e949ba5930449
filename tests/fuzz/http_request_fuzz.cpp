// Fuzz target for the HTTP request framing (server/http_framing.h): the bytes
// of one connection, fed through Beast's parser in pieces the way the
// Session feeds them (byte 0 picks the piece size), with the server's limits
// made small so they are reached. Checks: nothing throws or crashes; every
// refusal is one of the framing statuses; a buffer past its cap is refused;
// an accepted request's body stays within the body limit; keep-alive
// requests on one connection parse one after another.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include <boost/asio/buffer.hpp>

#include "server/http_framing.h"

namespace {

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

bool framing_status(int s) {
  return s == 400 || s == 413 || s == 417 || s == 431 || s == 501;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rill::server;
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  HttpLimits limits;
  limits.max_header_bytes = 512;
  limits.max_body_bytes = 1024;
  const size_t cap = read_buffer_limit(limits);

  boost::beast::flat_buffer buffer;
  std::optional<RequestParser> parser;
  bool head_checked = false;
  int n_requests = 0;
  auto fresh = [&] {
    parser.emplace();
    configure_parser(*parser, limits);
    head_checked = false;
  };
  fresh();
  while (n_requests < 64) {
    const FramingError err = feed(*parser, buffer, limits);
    if (!err.ok()) {
      FUZZ_CHECK(framing_status(err.status));
      FUZZ_CHECK(!err.message.empty());
      return 0;  // the server answers and closes
    }
    if (!head_checked && parser->is_header_done()) {
      head_checked = true;
      HeadInfo info;
      const FramingError head_err = check_head(*parser, limits, info);
      if (!head_err.ok()) {
        FUZZ_CHECK(framing_status(head_err.status));
        return 0;
      }
      continue;
    }
    if (parser->is_done()) {
      HttpRequest req = to_http_request(parser->release());
      FUZZ_CHECK(req.body.size() <= limits.max_body_bytes);
      FUZZ_CHECK(req.path.find('?') == std::string::npos);
      ++n_requests;
      fresh();
      continue;
    }
    if (buffer.size() >= cap) return 0;  // refused with 431 by the server
    if (in.empty()) {
      boost::beast::error_code ec;
      parser->put_eof(ec);  // the client closed: must not throw either
      return 0;
    }
    const size_t n = std::min({piece, in.size(), cap - buffer.size()});
    auto dst = buffer.prepare(n);
    std::memcpy(dst.data(), in.data(), n);
    buffer.commit(n);
    in.remove_prefix(n);
  }
  return 0;
}
