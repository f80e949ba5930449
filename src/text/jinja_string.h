#pragma once
// Python str semantics over UTF-8 strings, for the Jinja interpreter.
// Python strings are sequences of code points; here they are UTF-8 bytes.
// Bytes that are not valid UTF-8 decode to U+DC80..U+DCFF (Python's
// surrogateescape) and encode back to the same byte, so no input is lost.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rill::jinja {

std::u32string decode_utf8(std::string_view s);
void append_utf8(char32_t cp, std::string& out);
std::string encode_utf8(std::u32string_view s);
size_t n_code_points(std::string_view s);
// markupsafe's escape: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(std::string_view s);
bool is_ascii(std::string_view s);

bool py_isspace(char32_t cp);
bool py_isalnum(char32_t cp);  // str.isalnum for one code point (letters + digits)
bool py_isprintable(char32_t cp);
char32_t py_upper(char32_t cp);
char32_t py_lower(char32_t cp);
bool py_is_cased_upper(char32_t cp);
bool py_is_cased_lower(char32_t cp);

// str.strip/lstrip/rstrip; chars == nullopt strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; sep == nullopt splits on runs of whitespace.
// Requires sep to be non-empty (the caller raises ValueError).
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
std::string py_upper_str(std::string_view s);
std::string py_lower_str(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
// Code point index of the first (or last) occurrence of sub, or -1.
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);
int64_t py_count(std::string_view s, std::string_view sub);
// repr() of a str: quotes chosen as Python does, non-printables escaped.
std::string py_repr_string(std::string_view s);
// Decodes the body of a Jinja string literal (Python unicode-escape rules).
std::string decode_string_literal(std::string_view body);

}  // namespace rill::jinja
