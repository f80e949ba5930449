#include "server/web/web_page.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "server/web/assets.h"

namespace rill::server {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string header(const WebResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

// The embedded bytes are the files' bytes: the page's own files from the
// source tree, the libraries from their Debian packages.
TEST(WebPage, EmbedsTheFilesByteForByte) {
  const std::string web = std::string(RILL_SOURCE_DIR) + "/src/server/web/";
  const std::map<std::string, std::string> sources = {
      {"index.html", web + "chat.html"},
      {"chat.js", web + "chat.js"},
      {"chat.css", web + "chat.css"},
      {"marked.js", "/usr/share/javascript/marked/marked.umd.min.js"},
      {"highlight.js", "/usr/share/javascript/highlight.js/highlight.min.js"},
      {"highlight.css", "/usr/share/javascript/highlight.js/styles/github.css"},
      {"purify.js", "/usr/share/nodejs/dompurify/dist/purify.min.js"},
  };
  ASSERT_EQ(embedded_web_assets().size(), sources.size());
  for (const WebAsset& a : embedded_web_assets()) {
    ASSERT_TRUE(sources.count(a.name)) << a.name;
    const std::string want = read_file(sources.at(a.name));
    ASSERT_FALSE(want.empty()) << sources.at(a.name);
    EXPECT_EQ(a.body, want) << a.name;
    EXPECT_EQ(std::string(a.version).find_first_not_of("0123456789abcdef"), std::string::npos) << a.name;
    EXPECT_EQ(std::string(a.version).size(), 16u) << a.name;
  }
}

TEST(WebPage, IndexLinksEveryAssetWithItsVersion) {
  const auto r = web_page_response("/", "key=abc");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(r->body.find("{{asset:"), std::string::npos);
  EXPECT_EQ(r->body.find("?v=missing"), std::string::npos);
  for (const WebAsset& a : embedded_web_assets()) {
    if (std::string(a.name) == "index.html") continue;
    EXPECT_NE(r->body.find("\"/assets/" + std::string(a.name) + "?v=" + a.version + "\""), std::string::npos) << a.name;
  }
  EXPECT_EQ(header(*r, "Cache-Control"), "no-cache");
  const std::string csp = header(*r, "Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self';"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << csp;
  EXPECT_EQ(header(*r, "X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(web_page_response("/index.html", "")->body, r->body);
}

TEST(WebPage, VersionedAssetsAreImmutableOthersRevalidate) {
  const WebAsset* js = nullptr;
  for (const WebAsset& a : embedded_web_assets()) {
    if (std::string(a.name) == "chat.js") js = &a;
  }
  ASSERT_TRUE(js);
  const std::string v = js->version;
  const char* kForever = "public, max-age=31536000, immutable";
  for (const std::string& q : {"v=" + v, "x=1&v=" + v, "v=0&v=" + v}) {
    const auto r = web_page_response("/assets/chat.js", q);
    ASSERT_TRUE(r) << q;
    EXPECT_EQ(r->content_type, "text/javascript; charset=utf-8");
    EXPECT_EQ(r->body, js->body);
    EXPECT_EQ(header(*r, "Cache-Control"), kForever) << q;
    EXPECT_EQ(header(*r, "ETag"), "\"" + v + "\"");
  }
  for (const std::string& q : {std::string(), "v=" + v.substr(1), "v=" + v + "0", "xv=" + v, "v" + v}) {
    EXPECT_EQ(header(*web_page_response("/assets/chat.js", q), "Cache-Control"), "no-cache") << q;
  }
  EXPECT_EQ(web_page_response("/assets/chat.css", "")->content_type, "text/css; charset=utf-8");
}

TEST(WebPage, UnknownPathsAreNotFound) {
  for (const char* p :
       {"/assets/", "/assets/nope.js", "/assets/index.html", "/assets/../chat.js", "/chat.js", "/assets/chat.js/"}) {
    EXPECT_FALSE(web_page_response(p, "")) << p;
  }
}

}  // namespace
}  // namespace rill::server
