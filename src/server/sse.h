#pragma once
// Server-sent event frames.
#include <string>
#include <string_view>

namespace rill::server {

// "data: <data>\n\n" (data must not contain a newline; JSON dumps do not).
inline std::string sse_data(std::string_view data) {
  std::string s;
  s.reserve(data.size() + 8);
  s += "data: ";
  s += data;
  s += "\n\n";
  return s;
}

// "event: <name>\ndata: <data>\n\n" (Responses and Anthropic grammars).
inline std::string sse_event(std::string_view name, std::string_view data) {
  std::string s;
  s.reserve(name.size() + data.size() + 16);
  s += "event: ";
  s += name;
  s += "\ndata: ";
  s += data;
  s += "\n\n";
  return s;
}

}  // namespace rill::server
