#pragma once
// GET / (the chat page) and GET /assets/<name> (its scripts and styles).
// Neither needs an API key: they hold no secrets, and a browser opening a
// page cannot attach one; the page's API calls carry the key (?key=...).
#include <optional>
#include <string>

#include "server/http.h"

namespace rill::server {

struct WebResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  HeaderList headers;
};

// `path` is "/", "/index.html" or "/assets/<name>"; `query` the raw query
// string. Assets asked for with ?v=<their version> (as the page links them)
// are cacheable for a year; anything else is revalidated on every load, so a
// new binary's page is never mixed with an old cached script. nullopt: no
// such asset (a 404).
std::optional<WebResponse> web_page_response(const std::string& path, const std::string& query);

}  // namespace rill::server
