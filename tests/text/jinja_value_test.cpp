#include "text/jinja_value.h"

#include <gtest/gtest.h>

#include <string>

#include "text/chat_template.h"

namespace rill::jinja {
namespace {

// nlohmann parses and destroys deep values iteratively; from_json used to
// recurse once per level (a 13,800-level request value overflowed the stack).
nlohmann::ordered_json deep_array(int levels) {
  return nlohmann::ordered_json::parse(std::string(size_t(levels), '[') + std::string(size_t(levels), ']'));
}

TEST(JinjaValue, FromJsonBoundsItsRecursion) {
  const Value v = from_json(deep_array(200000));
  const Value* at = &v;
  int depth = 1;
  while (at->kind == Kind::kList) {
    ASSERT_EQ(at->list->size(), 1u);
    at = &(*at->list)[0];
    ++depth;
  }
  EXPECT_EQ(depth, kMaxFromJsonDepth + 1);
  EXPECT_TRUE(at->is_undefined());
  EXPECT_NE(at->undefined_message().find("nested deeper than 512 levels"), std::string::npos);
}

TEST(JinjaValue, TooDeepValueFailsTheRender) {
  auto t = ChatTemplate::parse("{{ x | tojson }}");
  ASSERT_TRUE(t.ok());
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["x"] = deep_array(20000);  // moved in: nlohmann copies recurse
  auto out = t->render(context);
  EXPECT_FALSE(out.ok());
  // Within the bound it renders.
  context["x"] = deep_array(100);
  out = t->render(context);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out.value(), std::string(100, '[') + std::string(100, ']'));
}

}  // namespace
}  // namespace rill::jinja
