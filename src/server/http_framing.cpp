#include "server/http_framing.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <vector>

#include <boost/beast/http/error.hpp>

namespace rill::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The codings of every Transfer-Encoding line, in order, empty items dropped.
std::vector<std::string> transfer_codings(const http::request_header<>& h) {
  std::vector<std::string> out;
  for (auto it = h.find(http::field::transfer_encoding); it != h.end() && it->name() == http::field::transfer_encoding;
       ++it) {
    std::string_view v(it->value().data(), it->value().size());
    while (!v.empty()) {
      const size_t comma = v.find(',');
      const std::string_view item = trim(v.substr(0, comma));
      if (!item.empty()) out.emplace_back(item);
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
    }
  }
  return out;
}

FramingError parse_error(beast::error_code ec, const HttpLimits& limits) {
  if (ec == http::error::header_limit) {
    return {431, "request header exceeds the limit of " + std::to_string(limits.max_header_bytes) + " bytes"};
  }
  if (ec == http::error::body_limit) {
    return {413, "request body exceeds the limit of " + std::to_string(limits.max_body_bytes) + " bytes"};
  }
  if (ec == http::error::buffer_overflow) return buffer_full_error(limits);
  if (ec == http::error::bad_transfer_encoding) {
    return {400, "malformed HTTP request: Transfer-Encoding is repeated or conflicts with Content-Length"};
  }
  return {400, "malformed HTTP request: " + ec.message()};
}

}  // namespace

void configure_parser(RequestParser& parser, const HttpLimits& limits) {
  parser.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser.body_limit(limits.max_body_bytes);
  parser.eager(false);
}

size_t read_buffer_limit(const HttpLimits& limits) {
  // Beast stores a field in at most 64 KiB; stay under that so a trailer
  // field can never reach the size at which it throws.
  return std::min<size_t>(limits.max_header_bytes, 60 << 10) + 4096;
}

FramingError buffer_full_error(const HttpLimits& limits) {
  return {431, "request header, chunk line or trailer exceeds the limit of " +
                   std::to_string(read_buffer_limit(limits)) + " bytes"};
}

FramingError feed(RequestParser& parser, beast::flat_buffer& buffer, const HttpLimits& limits) {
  while (buffer.size() > 0 && !parser.is_done()) {
    const bool header_was_done = parser.is_header_done();
    beast::error_code ec;
    size_t n = 0;
    try {
      n = parser.put(buffer.data(), ec);
    } catch (const std::length_error&) {
      return buffer_full_error(limits);  // a field too large for Beast's storage
    } catch (const std::exception& e) {
      return {400, std::string("malformed HTTP request: ") + e.what()};
    }
    buffer.consume(n);
    if (ec == http::error::need_more) break;
    if (ec) return parse_error(ec, limits);
    if (!header_was_done && parser.is_header_done()) break;  // the caller checks the head
    if (n == 0) break;
  }
  return {};
}

FramingError check_head(const RequestParser& parser, const HttpLimits& limits, HeadInfo& info) {
  const auto& h = parser.get();
  info = {};
  const std::vector<std::string> codings = transfer_codings(h);
  const bool has_te = h.find(http::field::transfer_encoding) != h.end();
  if (has_te) {
    if (h.find(http::field::content_length) != h.end()) {
      return {400, "malformed HTTP request: Content-Length together with Transfer-Encoding"};
    }
    if (codings.empty() || !iequals(codings.back(), "chunked")) {
      return {400, "malformed HTTP request: the last Transfer-Encoding must be chunked (got '" +
                       std::string(h[http::field::transfer_encoding]) + "')"};
    }
    if (codings.size() > 1) {
      return {501, "Transfer-Encoding '" + std::string(h[http::field::transfer_encoding]) +
                       "' is not supported (only chunked)"};
    }
  }
  if (auto it = h.find(http::field::expect); it != h.end()) {
    if (!iequals(trim(std::string_view(it->value().data(), it->value().size())), "100-continue")) {
      return {417, "Expect '" + std::string(it->value()) + "' is not supported (only 100-continue)"};
    }
    info.expect_continue = h.version() >= 11;
  }
  const auto length = parser.content_length();
  if (length && *length > limits.max_body_bytes) {  // Beast refuses this too; kept for clarity
    return {413, "request body exceeds the limit of " + std::to_string(limits.max_body_bytes) + " bytes"};
  }
  info.has_body = parser.chunked() || (length && *length > 0);
  return {};
}

HttpRequest to_http_request(http::request<http::string_body>&& msg) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  const std::string_view target(msg.target().data(), msg.target().size());
  const size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
  for (const auto& field : msg) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    req.headers[name] = std::string(field.value());
  }
  req.body = std::move(msg.body());
  return req;
}

}  // namespace rill::server
