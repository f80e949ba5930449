// StopMatcher against a brute-force reference: the stop is the one ending
// first in the whole text (the longest among those ending there), the answer
// is the text before it. Checked at every delta: what was emitted is a prefix
// of the answer, holds no stop string, never ends inside a character, and
// the held-back bytes are exactly the longest suffix that could start a stop.
#include "text/stop_matcher.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "text/unicode.h"

namespace rill {
namespace {

struct RefStop {
  size_t start;  // byte offset of the winning stop in the text
  std::string stop;
};

// Brute force: for each end position in order, the longest stop ending there.
std::optional<RefStop> reference_stop(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    const std::string* best = nullptr;
    for (const auto& s : stops) {
      if (s.empty() || s.size() > end) continue;
      if (text.compare(end - s.size(), s.size(), s) != 0) continue;
      if (!best || s.size() > best->size()) best = &s;
    }
    if (best) return RefStop{end - best->size(), *best};
  }
  return std::nullopt;
}

bool is_prefix_of_some_stop(std::string_view s, const std::vector<std::string>& stops) {
  for (const auto& stop : stops) {
    if (!stop.empty() && stop.size() > s.size() && std::string_view(stop).substr(0, s.size()) == s) return true;
  }
  return false;
}

// Feeds `deltas` and checks every invariant against the reference; returns
// the full emitted text (after flush when no stop matched).
std::string run_checked(const std::vector<std::string>& stops, const std::vector<std::string>& deltas) {
  std::string text;
  for (const auto& d : deltas) text += d;
  const auto ref = reference_stop(text, stops);
  const std::string answer = ref ? text.substr(0, ref->start) : text;
  size_t max_len = 0;
  for (const auto& s : stops) max_len = std::max(max_len, s.size());

  StopMatcher m(stops);
  std::string emitted;
  std::string fed;
  for (const auto& d : deltas) {
    const bool was_stopped = m.stopped();
    const bool hit = m.push(d, emitted);
    EXPECT_EQ(hit, m.stopped());
    if (was_stopped) continue;
    fed += d;
    EXPECT_EQ(answer.compare(0, emitted.size(), emitted), 0) << "emitted text is not a prefix of the answer";
    EXPECT_TRUE(text::is_valid_utf8(emitted));
    for (const auto& s : stops) {
      if (s.empty()) continue;
      EXPECT_EQ(emitted.find(s), std::string::npos) << "emitted stop '" << s << "'";
    }
    if (hit) continue;
    // Not stopped: emitted + held == fed, the held part is the longest
    // suffix of `fed` that is a proper prefix of a stop.
    EXPECT_EQ(emitted.size() + m.held_bytes(), fed.size());
    EXPECT_LE(m.held_bytes(), max_len == 0 ? 0 : max_len - 1);
    const std::string_view held = std::string_view(fed).substr(emitted.size());
    EXPECT_TRUE(held.empty() || is_prefix_of_some_stop(held, stops));
    for (size_t p = 0; p < emitted.size(); ++p) {
      EXPECT_FALSE(is_prefix_of_some_stop(std::string_view(fed).substr(p), stops)) << "emitted too early at " << p;
    }
  }
  EXPECT_EQ(m.stopped(), ref.has_value());
  if (ref) {
    EXPECT_EQ(m.matched(), ref->stop);
    EXPECT_EQ(m.held_bytes(), 0u);
  } else {
    m.flush(emitted);
    EXPECT_EQ(m.held_bytes(), 0u);
  }
  EXPECT_EQ(emitted, answer);
  return emitted;
}

std::vector<std::string> chars_of(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<uint8_t>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::vector<std::string> bytes_of(std::string_view s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

TEST(StopMatcher, StopAtTheVeryStart) {
  EXPECT_EQ(run_checked({"ab"}, {"abc"}), "");
  EXPECT_EQ(run_checked({"ab"}, {"a", "b", "c"}), "");
  StopMatcher m({"ab"});
  std::string out;
  EXPECT_TRUE(m.push("abXYZ", out));
  EXPECT_EQ(out, "");
  EXPECT_EQ(m.matched(), "ab");
}

TEST(StopMatcher, StopEqualsTheWholeText) {
  EXPECT_EQ(run_checked({"hello"}, {"hel", "lo"}), "");
  EXPECT_EQ(run_checked({"hello"}, {"hello"}), "");
}

TEST(StopMatcher, OverlappingStopsEndingTogetherTakeTheLongest) {
  StopMatcher m({"ab", "aab"});
  std::string out;
  EXPECT_TRUE(m.push("xaab", out));
  EXPECT_EQ(out, "x");
  EXPECT_EQ(m.matched(), "aab");
  EXPECT_EQ(run_checked({"aab", "ab"}, bytes_of("xaaab")), "xa");
}

TEST(StopMatcher, TheStopEndingFirstWinsOverOneStartingEarlier) {
  StopMatcher m({"abc", "b"});
  std::string out;
  EXPECT_TRUE(m.push("abc", out));
  EXPECT_EQ(out, "a");
  EXPECT_EQ(m.matched(), "b");
}

TEST(StopMatcher, SelfOverlappingStopFedByteByByte) {
  EXPECT_EQ(run_checked({"aab"}, bytes_of("aaaab")), "aa");
  EXPECT_EQ(run_checked({"abab"}, bytes_of("abaababab")), "aba");
}

TEST(StopMatcher, StopSpanningManyDeltas) {
  const std::string text = "Sure, here it is.\nDone\n\nUser: more text after";
  EXPECT_EQ(run_checked({"\n\nUser:"}, bytes_of(text)), "Sure, here it is.\nDone");
  StopMatcher m({"\n\nUser:"});
  std::string out;
  for (char c : std::string("ok\n\nUse")) EXPECT_FALSE(m.push(std::string_view(&c, 1), out));
  EXPECT_EQ(out, "ok");
  EXPECT_EQ(m.held_bytes(), 5u);
}

TEST(StopMatcher, PartialMatchThatFailsIsReleased) {
  StopMatcher m({"abd"});
  std::string out;
  EXPECT_FALSE(m.push("xab", out));
  EXPECT_EQ(out, "x");
  EXPECT_EQ(m.held_bytes(), 2u);
  EXPECT_FALSE(m.push("c", out));
  EXPECT_EQ(out, "xabc");
  EXPECT_FALSE(m.push("ab", out));
  m.flush(out);  // end of stream releases the held "ab"
  EXPECT_EQ(out, "xabcab");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, UnicodeStops) {
  EXPECT_EQ(run_checked({"日本"}, chars_of("a日b日本c")), "a日b");
  EXPECT_EQ(run_checked({"é\n"}, chars_of("ééé\nx")), "éé");
  // Stops sharing a lead byte with the text: "日" = E6 97 A5, "本" = E6 9C AC.
  EXPECT_EQ(run_checked({"本"}, {"日", "日日", "本"}), "日日日");
}

TEST(StopMatcher, NothingIsPushedAfterAStop) {
  StopMatcher m({"x"});
  std::string out;
  EXPECT_TRUE(m.push("abxcd", out));
  EXPECT_TRUE(m.push("more", out));
  m.flush(out);
  EXPECT_EQ(out, "ab");
}

TEST(StopMatcher, EmptyStopsAndEmptyDeltas) {
  StopMatcher none({"", ""});
  EXPECT_FALSE(none.has_stops());
  std::string out;
  EXPECT_FALSE(none.push("abc", out));
  EXPECT_EQ(out, "abc");
  EXPECT_EQ(none.held_bytes(), 0u);
  EXPECT_EQ(run_checked({"", "b"}, {"", "a", "", "b", ""}), "a");
}

TEST(StopMatcher, InvalidUtf8StopNeverSplitsACharacter) {
  // "é" = C3 A9; a stop starting with the continuation byte A9 may match a
  // suffix of it, but the cut must not fall inside the character.
  StopMatcher m({"\xA9z"});
  std::string out;
  EXPECT_FALSE(m.push("aé", out));
  EXPECT_EQ(out, "a");
  EXPECT_FALSE(m.push("y", out));
  EXPECT_EQ(out, "aéy");
}

TEST(StopMatcher, LongStreamInSingleBytesHoldsLittle) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line of text \n\nUse";
  text += "\n\nUser:";
  StopMatcher m({"\n\nUser:", "<|im_end|>", "###"});
  std::string out;
  size_t max_held = 0;
  for (char c : text) {
    m.push(std::string_view(&c, 1), out);
    max_held = std::max(max_held, m.held_bytes());
  }
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out.size(), text.size() - 7);
  EXPECT_LE(max_held, 9u);
}

TEST(StopMatcher, RandomTextsSplitsAndStopsMatchTheReference) {
  const std::vector<std::string> alphabet = {"a", "b", "é", "日", "\n"};
  std::mt19937 rng(1234);
  auto random_string = [&](int n_chars) {
    std::string s;
    for (int i = 0; i < n_chars; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  int n_stopped = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::string> stops;
    const int n_stops = static_cast<int>(rng() % 5);
    for (int k = 0; k < n_stops; ++k) stops.push_back(random_string(static_cast<int>(rng() % 5)));
    const auto chars = chars_of(random_string(static_cast<int>(rng() % 40)));
    // Random deltas of 0..4 whole characters.
    std::vector<std::string> deltas;
    for (size_t i = 0; i < chars.size();) {
      const size_t n = rng() % 5;
      std::string d;
      for (size_t k = 0; k < n && i < chars.size(); ++k) d += chars[i++];
      deltas.push_back(d);
    }
    std::string text;
    for (const auto& d : deltas) text += d;
    SCOPED_TRACE("iter " + std::to_string(iter) + " text '" + text + "'");
    run_checked(stops, deltas);
    n_stopped += reference_stop(text, stops).has_value();
    if (::testing::Test::HasFailure()) break;
  }
  // Both outcomes are exercised often.
  EXPECT_GT(n_stopped, 5000);
  EXPECT_LT(n_stopped, 15000);
}

}  // namespace
}  // namespace rill
