#include "text/harmony_parser.h"

#include <array>
#include <variant>

#include "core/json_parse.h"

namespace rill {
namespace {

constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kChannel = "<|channel|>";
// The markers that end a body.
constexpr std::array<std::string_view, 4> kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// The first whitespace-delimited word of s from `from`, stopping at '<'.
std::string word_at(const std::string& s, size_t from) {
  size_t b = from;
  while (b < s.size() && is_space(s[b])) ++b;
  size_t e = b;
  while (e < s.size() && !is_space(s[e]) && s[e] != '<') ++e;
  return s.substr(b, e - b);
}

// Where the earliest body end marker starts in s (npos: none), and its length.
size_t find_body_end(const std::string& s, size_t* len) {
  size_t best = std::string::npos;
  for (std::string_view m : kBodyEnds) {
    const size_t at = s.find(m);
    if (at < best) {
      best = at;
      *len = m.size();
    }
  }
  return best;
}

// The length of the longest suffix of s that is a proper prefix of a body
// end marker (text that must wait for more).
// Every marker starts with '<' and holds no other, so such a suffix starts
// at the last '<'.
size_t partial_marker_tail(const std::string& s) {
  const size_t start = s.rfind('<');
  if (start == std::string::npos) return 0;
  const std::string_view tail = std::string_view(s).substr(start);
  for (std::string_view m : kBodyEnds) {
    if (tail.size() < m.size() && m.substr(0, tail.size()) == tail) return tail.size();
  }
  return 0;
}

}  // namespace

void HarmonyParser::push(std::string_view text, OutputDelta& out) {
  buf_.append(text);
  drain(false, out);
}

void HarmonyParser::finish(OutputDelta& out) {
  drain(true, out);
  if (in_body_) {
    emit(buf_, out);
    end_body(out);
  }
  // A header the stream ended inside carries no text; text without any
  // harmony marker (a reply that ignored the format) is content.
  if (n_messages_ == 0 && buf_.find("<|") == std::string::npos) out.content += buf_;
  buf_.clear();
}

void HarmonyParser::drain(bool final, OutputDelta& out) {
  for (;;) {
    if (!in_body_) {
      const size_t at = buf_.find(kMessage);
      if (at == std::string::npos) return;  // the header is not complete
      const std::string header = buf_.substr(0, at);
      buf_.erase(0, at + kMessage.size());
      start_body(header, out);
      continue;
    }
    size_t len = 0;
    const size_t end = find_body_end(buf_, &len);
    if (end != std::string::npos) {
      emit(std::string_view(buf_).substr(0, end), out);
      const bool next_header = buf_.compare(end, len, "<|start|>") == 0;
      buf_.erase(0, end + (next_header ? 0 : len));
      end_body(out);
      continue;
    }
    const size_t keep = final ? 0 : partial_marker_tail(buf_);
    emit(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    return;
  }
}

void HarmonyParser::start_body(const std::string& header, OutputDelta& out) {
  in_body_ = true;
  ++n_messages_;
  std::string channel;
  if (const size_t c = header.find(kChannel); c != std::string::npos) channel = word_at(header, c + kChannel.size());
  std::string recipient;
  if (const size_t t = header.find("to="); t != std::string::npos) recipient = word_at(header, t + 3);
  if (parse_tool_calls_ && recipient.rfind("functions.", 0) == 0 && recipient.size() > 10) {
    body_ = Body::kToolCall;
    call_ = ToolCall{};
    call_.id = make_tool_call_id();
    call_.name = recipient.substr(10);
    call_body_.clear();
    ToolCallDelta d;
    d.index = n_calls_;
    d.id = call_.id;
    d.name = call_.name;
    out.tool_call_deltas.push_back(std::move(d));
  } else if (channel == "analysis") {
    body_ = Body::kReasoning;
  } else {
    body_ = Body::kContent;
  }
}

void HarmonyParser::emit(std::string_view text, OutputDelta& out) {
  if (text.empty()) return;
  switch (body_) {
    case Body::kContent:
      out.content += text;
      break;
    case Body::kReasoning:
      out.reasoning += text;
      break;
    case Body::kToolCall:
      call_body_ += text;
      break;
  }
}

void HarmonyParser::end_body(OutputDelta& out) {
  in_body_ = false;
  if (body_ != Body::kToolCall) return;
  // The model's text is untrusted: the bounded parser; an object is sent
  // compact, anything else as the model wrote it.
  auto parsed = parse_json(call_body_);
  const auto* value = std::get_if<nlohmann::ordered_json>(&parsed);
  call_.arguments = value && value->is_object()
                        ? value->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                        : call_body_;
  if (!call_.arguments.empty()) {
    ToolCallDelta d;
    d.index = n_calls_;
    d.arguments = call_.arguments;
    out.tool_call_deltas.push_back(std::move(d));
  }
  out.tool_calls.push_back(call_);
  ++n_calls_;
  body_ = Body::kContent;
}

}  // namespace rill
