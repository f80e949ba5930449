// ModulePattern (loader/module_pattern.h): transformers' re.match over
// module names, through PCRE2 with bounded work. The expectations on
// ordinary patterns are Python's re.match; a pattern that backtracks
// without bound must give an error naming it, quickly, not a hang or a
// stack overflow (std::regex, used before, did both: found by
// fuzz_hf_config).
#include "loader/module_pattern.h"

#include <gtest/gtest.h>

#include <string>

namespace rill {
namespace {

bool matches(const std::string& pattern, const std::string& name) {
  auto re = ModulePattern::compile(pattern);
  EXPECT_TRUE(re.ok()) << re.error().message;
  auto m = (*re)->matches_prefix(name);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return *m;
}

TEST(ModulePattern, MatchesAnchoredPrefixesAsPythonsReMatch) {
  EXPECT_TRUE(matches("model.layers.*.self_attn", "model.layers.3.self_attn"));
  EXPECT_TRUE(matches("model.layers.*.self_attn", "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(matches("layer.1", "layer.11.attn"));  // no module boundary
  EXPECT_TRUE(matches("model\\.layers\\.[0-9]+\\.mlp", "model.layers.12.mlp.router"));
  EXPECT_FALSE(matches("self_attn", "model.self_attn"));  // anchored at the start
  EXPECT_FALSE(matches("model.layers.1\\.", "model.layers.11.mlp"));
  EXPECT_FALSE(matches("lm_head", "lm_hea"));
}

TEST(ModulePattern, AnInvalidPatternIsAnErrorNamingWhere) {
  auto re = ModulePattern::compile("model.layers.**.self_attn");  // Python: "multiple repeat"
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.error().message.find("offset"), std::string::npos) << re.error().message;
  EXPECT_FALSE(ModulePattern::compile("model.layers.(").ok());
}

TEST(ModulePattern, CatastrophicBacktrackingIsAnErrorNotAHang) {
  const std::string name(1024, 'a');
  // (PCRE2 answers "(a|a)*b" at once: no 'b' in the name. These leave it
  // nothing to skip the search with.)
  EXPECT_FALSE(matches("(a|a)*b", name));
  for (const char* p : {"(a|a)*(b|c)", "(a*)*(b|c)", "(a|aa)+(b|c)", "((a+)+)+(b|c)"}) {
    auto re = ModulePattern::compile(p);
    ASSERT_TRUE(re.ok()) << p << ": " << re.error().message;
    auto m = (*re)->matches_prefix(name);
    ASSERT_FALSE(m.ok()) << p << " finished within the limits";
    EXPECT_NE(m.error().message.find(p), std::string::npos) << m.error().message;
  }
}

}  // namespace
}  // namespace rill
