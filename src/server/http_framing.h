#pragma once
// HTTP/1.x request framing: the one place that decides whether a request
// head is acceptable and how it becomes an HttpRequest. The Session (server
// /http_session.cpp) and the fuzz target (tests/fuzz/http_request_fuzz.cpp)
// both drive Beast's parser through these functions, so what the fuzzer
// checks is exactly what the server runs.
//
// Rules (each answered before any handler runs, and the connection closes):
//   header block or chunked trailer over max_header_bytes  -> 431
//   Content-Length over max_body_bytes (or a chunked body growing past it) -> 413
//   Transfer-Encoding whose last coding is not exactly "chunked" -> 400
//   Transfer-Encoding with any coding besides "chunked" -> 501 (not decoded)
//   Content-Length together with Transfer-Encoding -> 400
//   Expect other than 100-continue -> 417
//   anything else Beast refuses -> 400
#include <cstddef>
#include <string>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http.h"

namespace rill::server {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;  // request line + header fields; also bounds a trailer
  size_t max_body_bytes = 8 << 20;
};

// A refusal: the status and the message sent (OpenAI error shape).
struct FramingError {
  int status = 0;  // 0: no error
  std::string message;
  bool ok() const { return status == 0; }
};

// What the head asks of the server once it is accepted.
struct HeadInfo {
  bool expect_continue = false;  // answer "100 Continue" before reading the body
  bool has_body = false;         // Content-Length > 0 or chunked
};

// A fresh parser with the server's limits (header and body limits; not eager,
// so put() returns once the header is complete and the head can be checked
// before the body is read).
void configure_parser(RequestParser& parser, const HttpLimits& limits);

// The capacity the read buffer must never exceed: bounds what one chunk line
// or a trailer can hold (Beast has no limit of its own on trailers and throws
// on a field over 64 KiB; a full buffer is refused with 431 instead).
size_t read_buffer_limit(const HttpLimits& limits);

// Feeds the bytes in `buffer` to `parser`, consuming what it takes. Stops when
// the header has just completed (check it with check_head), when the message
// is done, when more bytes are needed, or on an error. Never throws.
// Returns the framing error, or status 0.
FramingError feed(RequestParser& parser, boost::beast::flat_buffer& buffer, const HttpLimits& limits);

// The error for a failed read: a full buffer is 431.
FramingError buffer_full_error(const HttpLimits& limits);

// Checks a complete head (call once, when parser.is_header_done() turns true).
FramingError check_head(const RequestParser& parser, const HttpLimits& limits, HeadInfo& info);

// The handler's view of a complete message: method, path and query split at
// the first '?', header names in lower case (a repeated header keeps the
// last value), the body moved out.
HttpRequest to_http_request(boost::beast::http::request<boost::beast::http::string_body>&& msg);

}  // namespace rill::server
