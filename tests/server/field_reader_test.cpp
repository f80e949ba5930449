#include "server/field_reader.h"

#include <gtest/gtest.h>

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

TEST(FieldReader, PathsOfNestedFields) {
  const Json body = Json::parse(R"({"messages": [{"content": [{"text": 3}]}]})");
  const FieldReader r(body);
  const FieldReader part = r.at("messages").at(0).at("content").at(0);
  EXPECT_EQ(part.path(), "messages[0].content[0]");
  std::optional<std::string> text;
  auto e = part.read_string("text", text);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "messages[0].content[0].text");
  EXPECT_EQ(e->message, "messages[0].content[0].text: expected a string, got a number");
}

TEST(FieldReader, AbsentAndNullAreUnset) {
  const Json body = Json::parse(R"({"a": null})");
  const FieldReader r(body);
  std::optional<int64_t> i;
  std::optional<bool> b;
  std::optional<FieldReader> o;
  EXPECT_FALSE(r.read_int("a", 0, 1, i));
  EXPECT_FALSE(r.read_bool("b", b));
  EXPECT_FALSE(r.read_object("a", o));
  EXPECT_FALSE(i || b || o);
  std::string s;
  EXPECT_EQ(r.require_string("a", s)->message, "a: field required");
}

TEST(FieldReader, IntegerRuleIsJsonSchemas) {
  const Json body =
      Json::parse(R"({"a": 5.0, "b": 5.5, "c": "5", "d": -0.0, "e": 1e300, "f": 18446744073709551615, "g": true})");
  const FieldReader r(body);
  std::optional<int64_t> x;
  EXPECT_FALSE(r.read_int("a", 0, 10, x));
  EXPECT_EQ(x, 5);
  EXPECT_EQ(r.read_int("b", 0, 10, x)->message, "b: expected an integer, got a number");
  EXPECT_EQ(r.read_int("c", 0, 10, x)->message, "c: expected an integer, got a string");
  EXPECT_FALSE(r.read_int("d", 0, 10, x));
  EXPECT_EQ(x, 0);
  EXPECT_EQ(r.read_int("e", 0, INT32_MAX, x)->message, "e: must be at least 0");
  EXPECT_EQ(r.read_int("f", INT64_MIN, INT64_MAX, x)->message, "f: must be at least -9223372036854775808");
  EXPECT_EQ(r.read_int("g", 0, 10, x)->message, "g: expected an integer, got a boolean");
}

TEST(FieldReader, OneRangeWording) {
  const Json body = Json::parse(R"({"t": 3, "p": 0, "n": 9, "m": -1, "k": 11})");
  const FieldReader r(body);
  std::optional<float> f;
  std::optional<int64_t> i;
  EXPECT_EQ(r.read_number("t", {0, 2}, f)->message, "t: must be in [0, 2]");
  EXPECT_EQ(r.read_number("p", {0, 1, true}, f)->message, "p: must be in (0, 1]");
  EXPECT_EQ(r.read_number("t", {0.5, 2.5}, f)->message, "t: must be in [0.5, 2.5]");
  EXPECT_EQ(r.read_int("n", 1, 8, i)->message, "n: must be in [1, 8]");
  EXPECT_EQ(r.read_int("m", 1, INT32_MAX, i)->message, "m: must be at least 1");
  EXPECT_EQ(r.read_int("k", INT64_MIN, 10, i)->message, "k: must be at most 10");
  EXPECT_FALSE(r.read_number("t", {0, 100}, f));
  EXPECT_EQ(f, 3.0f);
}

TEST(FieldReader, ContainerTypes) {
  const Json body = Json::parse(R"({"o": [], "a": {}})");
  const FieldReader r(body);
  std::optional<FieldReader> x;
  EXPECT_EQ(r.read_object("o", x)->message, "o: expected an object, got an array");
  EXPECT_EQ(r.read_array("a", x)->message, "a: expected an array, got an object");
  EXPECT_EQ(r.type_error("a", "a string or an array").message, "a: expected a string or an array, got an object");
}

}  // namespace
}  // namespace rill::server
