// One small template per interpreter feature, each checked byte for byte
// against Python jinja2 configured as transformers configures it
// (tests/data/templates/jinja_snippets.json, tools/make_template_goldens.py).
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace rill {
namespace {

nlohmann::ordered_json load(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::ordered_json::parse(in);
}

// The clock the goldens pinned strftime_now to: 2024-07-26 09:30:00.
std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  const std::time_t t = timegm(&tm);  // fills tm_wday / tm_yday
  gmtime_r(&t, &tm);
  return tm;
}

TEST(JinjaSnippets, MatchPythonJinja2) {
  const auto golden = load(std::string(RILL_TEST_DATA) + "/templates/jinja_snippets.json");
  const auto& context = golden["context"];
  ChatTemplateRenderOptions options;
  options.fixed_now = fixed_now();
  int n_checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string src = c["template"];
    SCOPED_TRACE("template: " + src);
    auto tmpl = ChatTemplate::parse(src);
    if (c.contains("expected")) {
      ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
      auto out = tmpl->render(context, options);
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_EQ(out.value(), c["expected"].get<std::string>());
    } else {
      const std::string error = c["error"];
      if (!tmpl.ok()) {
        ++n_checked;
        continue;
      }
      auto out = tmpl->render(context, options);
      EXPECT_FALSE(out.ok()) << "jinja2 raised " << error << "\nrill rendered: " << out.value();
    }
    ++n_checked;
  }
  EXPECT_GE(n_checked, 150);
}

}  // namespace
}  // namespace rill
