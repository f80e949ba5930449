#include "server/web/web_page.h"

#include <string_view>

#include "server/web/assets.h"

namespace rill::server {
namespace {

// The page runs only its own scripts: model output, rendered as sanitized
// markdown, can never bring a script (inline or external), a style
// attribute, a frame, or an image from elsewhere (which could carry
// conversation text out in its URL).
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const WebAsset* find_asset(std::string_view name) {
  for (const WebAsset& a : embedded_web_assets()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

// index.html with each "{{asset:NAME}}" replaced by /assets/NAME?v=VERSION.
std::string render_index() {
  const WebAsset* index = find_asset("index.html");
  std::string html(index ? index->body : std::string_view());
  constexpr std::string_view kOpen = "{{asset:", kClose = "}}";
  size_t pos = 0;
  while ((pos = html.find(kOpen, pos)) != std::string::npos) {
    const size_t end = html.find(kClose, pos);
    if (end == std::string::npos) break;
    const std::string name = html.substr(pos + kOpen.size(), end - pos - kOpen.size());
    const WebAsset* a = find_asset(name);
    const std::string url = "/assets/" + name + "?v=" + (a ? a->version : "missing");
    html.replace(pos, end + kClose.size() - pos, url);
    pos += url.size();
  }
  return html;
}

bool has_version(const std::string& query, std::string_view version) {
  size_t pos = 0;
  while (pos <= query.size()) {
    const size_t amp = std::min(query.find('&', pos), query.size());
    const std::string_view item(query.data() + pos, amp - pos);
    if (item.size() == version.size() + 2 && item.substr(0, 2) == "v=" && item.substr(2) == version) return true;
    pos = amp + 1;
  }
  return false;
}

}  // namespace

std::optional<WebResponse> web_page_response(const std::string& path, const std::string& query) {
  WebResponse r;
  r.headers = {{"X-Content-Type-Options", "nosniff"}, {"Referrer-Policy", "no-referrer"}};
  if (path == "/" || path == "/index.html") {
    static const std::string kIndex = render_index();
    r.content_type = "text/html; charset=utf-8";
    r.body = kIndex;
    r.headers.emplace_back("Cache-Control", "no-cache");
    r.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
    return r;
  }
  constexpr std::string_view kPrefix = "/assets/";
  if (path.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string name = path.substr(kPrefix.size());
  const WebAsset* a = name == "index.html" ? nullptr : find_asset(name);
  if (!a) return std::nullopt;
  r.content_type = a->content_type;
  r.body = std::string(a->body);
  r.headers.emplace_back("Cache-Control",
                         has_version(query, a->version) ? "public, max-age=31536000, immutable" : "no-cache");
  r.headers.emplace_back("ETag", std::string("\"") + a->version + "\"");
  return r;
}

}  // namespace rill::server
