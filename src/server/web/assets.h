#pragma once
// The files the chat page is made of, embedded into the binary at build time
// by cmake/web_assets.cmake: the page (chat.html, chat.js, chat.css in this
// folder) and the Debian-packaged libraries it renders markdown with
// (marked, highlight.js, DOMPurify). The generated source defines
// embedded_web_assets().
#include <span>
#include <string_view>

namespace rill::server {

struct WebAsset {
  const char* name;          // as served: /assets/<name> ("index.html" is served at /)
  const char* content_type;  // with charset for text
  const char* version;       // 16 hex digits of the file's SHA-256, for cache busting
  std::string_view body;
};

std::span<const WebAsset> embedded_web_assets();

}  // namespace rill::server
