#include "text/output_parser.h"

#include <algorithm>
#include <array>
#include <random>

#include <nlohmann/json.hpp>

#include "core/json_parse.h"
#include "text/harmony_parser.h"
#include "text/tool_call_blocks.h"

namespace rill {

// Calls framed by markers around a name and a JSON arguments object.
struct FramedCallFormat {
  std::string_view section_open, call_open, args_open, call_close, section_close;
  bool kimi_name;  // the name is written "functions.NAME:INDEX"
};
constexpr FramedCallFormat kDeepSeekCalls = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                                             "<｜tool▁call▁end｜>",    "<｜tool▁calls▁end｜>",  false};
constexpr FramedCallFormat kKimiCalls = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                                         "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                         "<|tool_calls_section_end|>",   true};

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kXmlFunction = "<function=";
constexpr std::string_view kXmlFunctionEnd = "</function>";
constexpr std::string_view kXmlParameter = "<parameter=";
constexpr std::string_view kXmlParameterEnd = "</parameter>";
// Gemma 4: <|channel>thought ... <channel|> and <|tool_call>call:NAME{...}<tool_call|>.
constexpr std::string_view kChannelOpen = "<|channel>thought";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kGemmaCallOpen = "<|tool_call>";
constexpr std::string_view kGemmaCallClose = "<tool_call|>";
constexpr std::string_view kGemmaQuote = "<|\"|>";
// Formats read whole (text/tool_call_blocks.h).
constexpr std::string_view kDsmlOpen = "<｜DSML｜function_calls>";
constexpr std::string_view kDsmlClose = "</｜DSML｜function_calls>";
constexpr std::string_view kActionOpen = "<|START_ACTION|>";
constexpr std::string_view kActionClose = "<|END_ACTION|>";
// Command R / R+: Action: ```json [...] ``` (calls only when the fence follows).
constexpr std::string_view kCommandRAction = "Action:";
constexpr std::string_view kJsonFenceOpen = "```json";
constexpr std::string_view kFence = "```";
constexpr int kMaxFenceTries = 16;  // closing-fence candidates tried per Command R block
// Granite 3.3: <|tool_call|>[{"name": ..., "arguments": ...}, ...], read as Mistral Nemo's list.
constexpr std::string_view kGraniteCalls = "<|tool_call|>";

constexpr size_t kMaxFramedName = 256;  // a longer name is not a call

// What opens tool calls in content, in the order step_content handles them.
constexpr std::array<std::string_view, 9> kCallMarkers = {kToolOpen,
                                                          kMistralCalls,
                                                          kGemmaCallOpen,
                                                          kDsmlOpen,
                                                          kActionOpen,
                                                          kDeepSeekCalls.section_open,
                                                          kKimiCalls.section_open,
                                                          kCommandRAction,
                                                          kGraniteCalls};
constexpr int kMaxGemmaDepth = 64;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Length of the longest suffix of `s` that is a proper prefix of `marker`
// (the bytes that may still become the marker).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// True when `s` is a proper prefix of `marker`.
bool is_partial(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

std::string dump_compact(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// `s` escaped as inside a JSON string, as nlohmann writes it (no quotes).
std::string json_string_body(std::string_view s) {
  const std::string quoted = dump_compact(nlohmann::ordered_json(std::string(s)));
  return quoted.substr(1, quoted.size() - 2);
}

// Bytes at the end of `s` that start a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t n = 1; n <= std::min<size_t>(3, s.size()); ++n) {
    const auto c = static_cast<unsigned char>(s[s.size() - n]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > n ? n : 0;
  }
  return 0;
}

// One value of Gemma 4's call syntax (its template's format_argument with
// unquoted keys) at s[i...] as JSON: <|"|>string<|"|>, {key:value,...},
// [value,...], or a bare word (true / false, a number, None / null; other
// words as strings). Advances i past it; false on malformed text.
bool read_gemma_value(std::string_view s, size_t& i, int depth, nlohmann::ordered_json& out) {
  if (depth > kMaxGemmaDepth || i >= s.size()) return false;
  if (starts_with(s.substr(i), kGemmaQuote)) {
    const size_t end = s.find(kGemmaQuote, i + kGemmaQuote.size());
    if (end == std::string_view::npos) return false;
    out = std::string(s.substr(i + kGemmaQuote.size(), end - i - kGemmaQuote.size()));
    i = end + kGemmaQuote.size();
    return true;
  }
  if (s[i] == '{' || s[i] == '[') {
    const bool object = s[i] == '{';
    const char close = object ? '}' : ']';
    out = object ? nlohmann::ordered_json::object() : nlohmann::ordered_json::array();
    ++i;
    if (i < s.size() && s[i] == close) {
      ++i;
      return true;
    }
    for (;;) {
      std::string key;
      if (object) {
        const size_t colon = s.find(':', i);
        if (colon == std::string_view::npos || colon == i) return false;
        key = std::string(s.substr(i, colon - i));
        if (key.find_first_of(",{}[]") != std::string::npos) return false;
        i = colon + 1;
      }
      nlohmann::ordered_json v;
      if (!read_gemma_value(s, i, depth + 1, v)) return false;
      if (object) {
        out[key] = std::move(v);
      } else {
        out.push_back(std::move(v));
      }
      if (i >= s.size()) return false;
      if (s[i] == ',') {
        ++i;
        continue;
      }
      if (s[i] != close) return false;
      ++i;
      return true;
    }
  }
  size_t end = i;
  while (end < s.size() && s[end] != ',' && s[end] != '}' && s[end] != ']') ++end;
  const std::string word(s.substr(i, end - i));
  if (word.empty()) return false;
  i = end;
  if (word == "None" || word == "null") {
    out = nullptr;
  } else {
    auto parsed = parse_json(word);
    auto* v = std::get_if<nlohmann::ordered_json>(&parsed);
    out = v && (v->is_number() || v->is_boolean()) ? *v : nlohmann::ordered_json(word);
  }
  return true;
}

// "call:NAME{key:value,...}" (the text between <|tool_call> and
// <tool_call|>) into `call` (id left empty); false when it is not that.
bool parse_gemma_call(std::string_view body, ToolCall& call) {
  constexpr std::string_view kCall = "call:";
  if (!starts_with(body, kCall)) return false;
  const size_t brace = body.find('{');
  if (brace == std::string_view::npos || brace == kCall.size()) return false;
  const std::string_view name = body.substr(kCall.size(), brace - kCall.size());
  if (name.find_first_of(" \n\t{}<>") != std::string_view::npos) return false;
  size_t i = brace;
  nlohmann::ordered_json args;
  if (!read_gemma_value(body, i, 0, args) || i != body.size() || !args.is_object()) return false;
  call.name = std::string(name);
  call.arguments = dump_compact(args);
  return true;
}

}  // namespace

bool parse_tool_call_json(std::string_view json_text, bool require_arguments, ToolCall& call) {
  // The model's text is as untrusted as a request (a prompt can ask for ten
  // thousand nested brackets): the bounded parser keeps the dump below from
  // recursing without limit; a call nested deeper stays plain text.
  auto parsed = parse_json(json_text);
  auto* value = std::get_if<nlohmann::ordered_json>(&parsed);
  if (value == nullptr || !value->is_object()) return false;
  const nlohmann::ordered_json& j = *value;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    if (require_arguments) return false;
    call.arguments = "{}";
  } else if (args->is_string()) {
    call.arguments = args->get<std::string>();  // already JSON text
  } else if (args->is_object()) {
    call.arguments = dump_compact(*args);
  } else {
    return false;
  }
  call.name = name->get<std::string>();
  return true;
}

std::string make_tool_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

OutputParser::OutputParser(OutputParserOptions options) : options_(options) {
  if (options_.harmony) harmony_ = std::make_unique<HarmonyParser>(options_.parse_tool_calls);
  if (!options_.parse_reasoning) options_.starts_in_reasoning = false;
  if (options_.starts_in_reasoning) {
    mode_ = Mode::kReasoning;
  } else if (!options_.parse_reasoning && !options_.parse_tool_calls) {
    mode_ = Mode::kContent;
  }
}

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

bool OutputParser::saw_tool_calls() const {
  return harmony_ ? harmony_->saw_tool_calls() : saw_tool_calls_;
}

void OutputParser::push(std::string_view text, OutputDelta& out) {
  if (harmony_) return harmony_->push(text, out);
  buf_.append(text);
  drain(false, out);
}

void OutputParser::finish(OutputDelta& out) {
  if (harmony_) return harmony_->finish(out);
  drain(true, out);
  buf_.clear();
  reasoning_ws_.clear();
  if (!saw_tool_calls_) out.content += content_ws_;
  content_ws_.clear();
}

void OutputParser::drain(bool final, OutputDelta& out) {
  for (;;) {
    bool changed = false;
    switch (mode_) {
      case Mode::kStart:
        changed = step_start(final, out);
        break;
      case Mode::kContent:
        changed = step_content(final, out);
        break;
      case Mode::kReasoning:
        changed = step_reasoning(final, out);
        break;
      case Mode::kToolCall:
        changed = step_tool_call(final, out);
        break;
      case Mode::kToolCallText:
        changed = step_tool_call_text(final, out);
        break;
      case Mode::kToolCallEnd:
        changed = step_tool_call_end(final);
        break;
      case Mode::kXmlCall:
        changed = step_xml_call(final, out);
        break;
      case Mode::kMistralCalls:
        changed = step_mistral_calls(final, out);
        break;
      case Mode::kDropRest:
        buf_.clear();
        break;
      case Mode::kJsonCalls:
        changed = step_json_calls(final, out);
        break;
      case Mode::kGemmaCall:
        changed = step_gemma_call(final, out);
        break;
      case Mode::kBlockCalls:
        changed = step_block_calls(final, out);
        break;
      case Mode::kFramedCalls:
        changed = step_framed_calls(final, out);
        break;
    }
    if (!changed) return;
  }
}

bool OutputParser::step_start(bool final, OutputDelta& out) {
  size_t i = 0;
  while (i < buf_.size() && is_space(buf_[i])) ++i;
  if (i == buf_.size()) {
    if (final) {
      emit_content(buf_, out);
      buf_.clear();
    }
    return false;  // only whitespace: wait for what follows
  }
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (options_.parse_reasoning && starts_with(rest, kThinkOpen)) {
    buf_.erase(0, i + kThinkOpen.size());
    mode_ = Mode::kReasoning;
    return true;
  }
  if (options_.parse_reasoning && starts_with(rest, kChannelOpen)) {
    buf_.erase(0, i + kChannelOpen.size());
    reasoning_close_ = kChannelClose;
    mode_ = Mode::kReasoning;
    return true;
  }
  if (options_.parse_tool_calls && (rest[0] == '{' || starts_with(rest, kPythonTag))) {
    // The raw text stays in buf_ (it becomes content if no call comes of it).
    json_scan_ = rest[0] == '{' ? i : i + kPythonTag.size();
    json_object_ = std::string::npos;
    json_any_call_ = json_array_ = false;
    mode_ = Mode::kJsonCalls;
    return true;
  }
  if (!final) {
    const bool maybe = (options_.parse_reasoning && (is_partial(rest, kThinkOpen) || is_partial(rest, kChannelOpen))) ||
                       (options_.parse_tool_calls && is_partial(rest, kPythonTag));
    if (maybe) return false;
  }
  mode_ = Mode::kContent;
  return true;
}

bool OutputParser::step_content(bool final, OutputDelta& out) {
  if (!options_.parse_tool_calls) {
    emit_content(buf_, out);
    buf_.clear();
    return false;
  }
  size_t at = std::string::npos, which = 0;
  for (size_t m = 0; m < kCallMarkers.size(); ++m) {
    const size_t found = buf_.find(kCallMarkers[m]);
    if (found < at) {
      at = found;
      which = m;
    }
  }
  if (at != std::string::npos) {
    emit_content(std::string_view(buf_).substr(0, at), out);  // whitespace before it stays held
    const std::string_view marker = kCallMarkers[which];
    if (marker == kMistralCalls || marker == kGraniteCalls) {
      buf_.erase(0, at);  // the marker stays: it is content if no call follows
      json_scan_ = marker.size();
      mode_ = Mode::kMistralCalls;
      return true;
    }
    buf_.erase(0, at + marker.size());
    if (marker == kToolOpen) {
      start_tool_call();
    } else if (marker == kGemmaCallOpen) {
      mode_ = Mode::kGemmaCall;
    } else if (marker == kDsmlOpen) {
      start_block(BlockKind::kDsml, kDsmlOpen, kDsmlClose);
    } else if (marker == kActionOpen) {
      start_block(BlockKind::kAction, kActionOpen, kActionClose);
    } else if (marker == kCommandRAction) {
      start_block(BlockKind::kCommandR, kCommandRAction, kFence);
    } else {
      framed_ = marker == kKimiCalls.section_open ? &kKimiCalls : &kDeepSeekCalls;
      mode_ = Mode::kFramedCalls;
    }
    return true;
  }
  size_t hold = 0;
  if (!final) {
    for (std::string_view m : kCallMarkers) hold = std::max(hold, partial_suffix(buf_, m));
  }
  emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
  buf_.erase(0, buf_.size() - hold);
  return false;
}

void OutputParser::start_block(BlockKind kind, std::string_view open, std::string_view close) {
  block_kind_ = kind;
  block_scanned_ = 0;
  block_tries_ = 0;
  block_open_ = open;
  block_close_ = close;
  mode_ = Mode::kBlockCalls;
}

// A block read whole at its closing marker (or the end of the reply): its
// calls then stream one delta each. Text that is not such a block stays
// content, markers included.
bool OutputParser::step_block_calls(bool final, OutputDelta& out) {
  size_t from = 0, at = std::string::npos;
  if (block_kind_ == BlockKind::kCommandR) {
    // "Action:" opens calls only when a ```json fence follows; otherwise it
    // is content and the text after it is read as content again.
    while (from < buf_.size() && is_space(buf_[from])) ++from;
    const std::string_view rest = std::string_view(buf_).substr(from);
    if (!starts_with(rest, kJsonFenceOpen)) {
      if (!final && is_partial(rest, kJsonFenceOpen)) return false;
      emit_content(block_open_, out);
      mode_ = Mode::kContent;
      return true;
    }
    from += kJsonFenceOpen.size();
    // The closing fence is the first after a ']' that ends the list (a ```
    // inside a string does not); fences already tried are not tried again.
    std::vector<ToolCall> probe;
    for (at = buf_.find(kFence, std::max(from, block_scanned_)); at != std::string::npos;
         at = buf_.find(kFence, at + 1)) {
      size_t end = at;
      while (end > from && is_space(buf_[end - 1])) --end;
      if (end <= from || buf_[end - 1] != ']') continue;
      // Each try parses the block from its start: a bounded number keeps a
      // reply of many "]```" (a grammar can force one) linear, not
      // quadratic, on the engine thread; past it the block is read at the end.
      if (block_tries_ >= kMaxFenceTries) {
        at = std::string::npos;
        break;
      }
      ++block_tries_;
      if (parse_action_calls(std::string_view(buf_).substr(from, at - from), probe)) break;
      probe.clear();
    }
    block_scanned_ = buf_.size() < kFence.size() ? 0 : buf_.size() - kFence.size() + 1;
  } else {
    at = buf_.find(block_close_);
  }
  if (at == std::string::npos && !final) return false;
  const std::string_view body =
      std::string_view(buf_).substr(from, (at == std::string::npos ? buf_.size() : at) - from);
  const size_t used = at == std::string::npos ? buf_.size() : at + block_close_.size();
  std::vector<ToolCall> calls;
  bool ok = false;
  switch (block_kind_) {
    case BlockKind::kGlm: {
      ToolCall call;
      ok = parse_glm_call(body, options_.parameter_types.get(), call);
      if (ok) calls.push_back(std::move(call));
      break;
    }
    case BlockKind::kDsml:
      ok = parse_dsml_calls(body, calls);
      break;
    case BlockKind::kAction:
    case BlockKind::kCommandR:
      ok = parse_action_calls(body, calls);
      break;
  }
  if (ok) {
    for (ToolCall& call : calls) {
      open_call(call.name, out);
      append_arguments(call.arguments, out);
      close_call(true, out);
    }
  } else {
    std::string raw(block_open_);
    raw += std::string_view(buf_).substr(0, used);
    emit_content(raw, out);
  }
  buf_.erase(0, used);
  mode_ = Mode::kContent;
  return true;
}

// DeepSeek V3.1 / Kimi K2: SECTION_OPEN (CALL_OPEN name ARGS_OPEN {json}
// CALL_CLOSE)* SECTION_CLOSE; the arguments stream as Mistral's do.
bool OutputParser::step_framed_calls(bool final, OutputDelta& out) {
  const FramedCallFormat& f = *framed_;
  for (;;) {
    if (call_open_) {
      buf_.erase(0, reader_->read(buf_));
      if (final) reader_->finish();
      stream_arguments(out);
      if (reader_->status() == JsonCallReader::Status::kReading) return false;
      const bool complete = reader_->status() == JsonCallReader::Status::kComplete;
      close_call(out);
      if (!complete) {
        buf_.clear();
        mode_ = Mode::kDropRest;
        return false;
      }
      continue;
    }
    size_t i = 0;
    while (i < buf_.size() && is_space(buf_[i])) ++i;
    buf_.erase(0, i);
    const std::string_view rest = buf_;
    if (starts_with(rest, f.call_close)) {
      buf_.erase(0, f.call_close.size());
      continue;
    }
    if (starts_with(rest, f.section_close)) {
      buf_.erase(0, f.section_close.size());
      trim_content_ = true;
      mode_ = Mode::kContent;
      return true;
    }
    if (starts_with(rest, f.call_open)) {
      // The name is what lies between call_open and args_open, at most
      // kMaxFramedName bytes: the search covers exactly that span (plus the
      // marker), so whole text and any split of it agree (fuzz-found).
      const size_t span = f.call_open.size() + kMaxFramedName + f.args_open.size();
      const size_t args_at = std::string_view(buf_).substr(0, span).find(f.args_open, f.call_open.size());
      if (args_at == std::string::npos) {
        if (!final && buf_.size() < span) return false;
      } else {
        std::string name = buf_.substr(f.call_open.size(), args_at - f.call_open.size());
        if (f.kimi_name) {  // functions.NAME:INDEX
          if (name.rfind("functions.", 0) == 0) name.erase(0, 10);
          const size_t colon = name.rfind(':');
          if (colon != std::string::npos) name.erase(colon);
        }
        const bool bad = name.empty() || std::any_of(name.begin(), name.end(),
                                                     [](char c) { return is_space(c) || c == '<' || c == '{'; });
        if (!bad) {
          buf_.erase(0, args_at + f.args_open.size());
          reader_.emplace(JsonCallReader::arguments_only());
          open_call(name, out);
          continue;
        }
      }
    } else if (!final && (rest.empty() || is_partial(rest, f.call_close) || is_partial(rest, f.section_close) ||
                          is_partial(rest, f.call_open))) {
      return false;
    }
    mode_ = Mode::kContent;  // not the format: the rest is content
    return true;
  }
}

bool OutputParser::step_reasoning(bool final, OutputDelta& out) {
  const std::string_view close = reasoning_close_;
  const size_t at = buf_.find(close);
  if (at != std::string::npos) {
    emit_reasoning(std::string_view(buf_).substr(0, at), out);
    reasoning_ws_.clear();
    buf_.erase(0, at + close.size());
    trim_content_ = true;
    mode_ = Mode::kContent;
    return true;
  }
  const size_t hold = final ? 0 : partial_suffix(buf_, close);
  emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - hold), out);
  buf_.erase(0, buf_.size() - hold);
  return false;
}

bool OutputParser::step_tool_call(bool final, OutputDelta& out) {
  if (!call_open_) {
    size_t first = 0;
    while (first < buf_.size() && is_space(buf_[first])) ++first;
    if (first < buf_.size() && buf_[first] == '<') {  // Qwen3-Coder / Qwen3.5 XML
      reader_.reset();
      mode_ = Mode::kXmlCall;
      return true;
    }
    if (first < buf_.size() && buf_[first] != '{') {  // GLM: <tool_call>NAME<arg_key>...
      reader_.reset();
      start_block(BlockKind::kGlm, kToolOpen, kToolClose);
      return true;
    }
    json_scan_ += reader_->read(std::string_view(buf_).substr(json_scan_));
    if (final) reader_->finish();
    if (reader_->is_call()) {
      buf_.erase(0, json_scan_);  // read; the raw text is no longer needed
      json_scan_ = 0;
      open_call(reader_->name(), out);
    } else if (reader_->status() == JsonCallReader::Status::kReading) {
      return false;
    } else {
      reader_.reset();
      mode_ = Mode::kToolCallText;
      return true;
    }
  }
  buf_.erase(0, reader_->read(buf_));
  if (final) reader_->finish();
  stream_arguments(out);
  if (reader_->status() == JsonCallReader::Status::kReading) return false;
  close_call(out);
  mode_ = Mode::kToolCallEnd;
  return true;
}

// Gemma 4: the call is read whole at <tool_call|> (or the end of the
// reply); its name and arguments then stream in one delta. Text that is not
// a call stays content, markers included.
bool OutputParser::step_gemma_call(bool final, OutputDelta& out) {
  const size_t at = buf_.find(kGemmaCallClose);
  if (at == std::string::npos && !final) return false;
  const std::string_view body = std::string_view(buf_).substr(0, at == std::string::npos ? buf_.size() : at);
  const size_t used = at == std::string::npos ? buf_.size() : at + kGemmaCallClose.size();
  ToolCall call;
  if (parse_gemma_call(body, call)) {
    open_call(call.name, out);
    append_arguments(call.arguments, out);
    close_call(true, out);
  } else {
    std::string raw(kGemmaCallOpen);
    raw += std::string_view(buf_).substr(0, used);
    emit_content(raw, out);
  }
  buf_.erase(0, used);
  mode_ = Mode::kContent;
  return true;
}

bool OutputParser::step_tool_call_text(bool final, OutputDelta& out) {
  const size_t at = buf_.find(kToolClose);
  if (at == std::string::npos && !final) return false;  // the block is not complete yet
  std::string raw(kToolOpen);
  raw += at == std::string::npos ? std::string_view(buf_) : std::string_view(buf_).substr(0, at + kToolClose.size());
  emit_content(raw, out);
  buf_.erase(0, at == std::string::npos ? buf_.size() : at + kToolClose.size());
  mode_ = Mode::kContent;
  return true;
}

bool OutputParser::step_tool_call_end(bool final) {
  const size_t close_at = buf_.find(kToolClose);
  const size_t open_at = buf_.find(kToolOpen);
  if (open_at != std::string::npos && (close_at == std::string::npos || open_at < close_at)) {
    buf_.erase(0, open_at + kToolOpen.size());  // the next call, without a closing tag before it
    start_tool_call();
    return true;
  }
  if (close_at != std::string::npos) {
    buf_.erase(0, close_at + kToolClose.size());
    trim_content_ = true;
    mode_ = Mode::kContent;
    return true;
  }
  const size_t hold = final ? 0 : std::max(partial_suffix(buf_, kToolClose), partial_suffix(buf_, kToolOpen));
  buf_.erase(0, buf_.size() - hold);
  return false;
}

bool OutputParser::step_json_calls(bool final, OutputDelta& out) {
  // Gives up on calls: [from, json_scan_) becomes content and the reply
  // continues as content from json_scan_. Only the read part is taken, so
  // what follows is parsed the same way however the text was split.
  auto give_up = [&](size_t from) {
    reader_.reset();
    const size_t upto = std::min(json_scan_, buf_.size());
    emit_content(std::string_view(buf_).substr(from, upto - from), out);
    buf_.erase(0, upto);
    mode_ = Mode::kContent;
    return true;
  };
  for (;;) {
    if (call_open_) {
      buf_.erase(0, reader_->read(buf_));
      if (final) reader_->finish();
      stream_arguments(out);
      if (reader_->status() == JsonCallReader::Status::kReading) return false;
      const bool complete = reader_->status() == JsonCallReader::Status::kComplete;
      close_call(out);
      if (!complete) {  // a call cut short: where its text ends is unknowable
        buf_.clear();
        mode_ = Mode::kDropRest;
        return false;
      }
      json_scan_ = 0;
      json_object_ = std::string::npos;
      continue;
    }
    if (json_object_ == std::string::npos) {  // between objects
      if (json_scan_ >= buf_.size()) break;
      const char c = buf_[json_scan_];
      if (is_space(c) || (json_any_call_ && c == (json_array_ ? ',' : ';'))) {
        ++json_scan_;
        continue;
      }
      if (json_array_ && json_any_call_ && c == ']') {  // the end of Mistral's [TOOL_CALLS][...]
        buf_.erase(0, json_scan_ + 1);
        json_array_ = false;
        trim_content_ = true;
        mode_ = Mode::kContent;
        return true;
      }
      if (c == '{') {
        json_object_ = json_scan_;
        reader_.emplace(/*require_arguments=*/true);
        continue;
      }
      if (!json_any_call_) return give_up(0);
      // Text after the calls: content from here on.
      buf_.erase(0, json_scan_);
      trim_content_ = true;
      mode_ = Mode::kContent;
      return true;
    }
    // An object that is not a call yet.
    json_scan_ += reader_->read(std::string_view(buf_).substr(json_scan_));
    if (final) reader_->finish();
    if (reader_->is_call()) {
      buf_.erase(0, json_scan_);
      json_scan_ = 0;
      json_any_call_ = true;
      open_call(reader_->name(), out);
      continue;
    }
    if (reader_->status() == JsonCallReader::Status::kReading) return false;
    return give_up(json_any_call_ ? json_object_ : 0);
  }
  if (!final) return false;
  if (!json_any_call_) return give_up(0);  // e.g. only "<|python_tag|>"
  buf_.clear();                            // trailing separators
  mode_ = Mode::kContent;
  return false;
}

const std::string* OutputParser::parameter_type(const std::string& parameter) const {
  if (!options_.parameter_types) return nullptr;
  auto tool = options_.parameter_types->find(call_.name);
  if (tool == options_.parameter_types->end()) return nullptr;
  auto p = tool->second.find(parameter);
  return p == tool->second.end() ? nullptr : &p->second;
}

std::string OutputParser::xml_value_json(const std::string& parameter, std::string_view value) const {
  return bare_value_json(parameter_type(parameter), value);
}

bool OutputParser::step_xml_call(bool final, OutputDelta& out) {
  size_t i = 0;
  while (i < buf_.size() && is_space(buf_[i])) ++i;
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (!call_open_) {  // <function=NAME>
    auto not_a_call = [&] {
      mode_ = Mode::kToolCallText;
      return true;
    };
    if (!starts_with(rest, kXmlFunction)) return !final && is_partial(rest, kXmlFunction) ? false : not_a_call();
    const size_t name_at = i + kXmlFunction.size();
    const size_t end = buf_.find('>', name_at);
    const std::string_view name =
        std::string_view(buf_).substr(name_at, end == std::string::npos ? std::string::npos : end - name_at);
    const bool bad_name = std::any_of(name.begin(), name.end(), [](char c) { return is_space(c) || c == '<'; });
    if (bad_name || (end == name_at)) return not_a_call();
    if (end == std::string::npos) return final ? not_a_call() : false;
    const std::string call_name(name);
    buf_.erase(0, end + 1);
    open_call(call_name, out);
    append_arguments("{", out);
    n_xml_parameters_ = 0;
    xml_in_value_ = false;
    return true;
  }
  auto broken = [&] {
    close_call(/*complete=*/false, out);
    mode_ = Mode::kToolCallEnd;
    return true;
  };
  if (xml_in_value_) {
    if (!xml_value_started_) {  // the template's "\n" after <parameter=...> is not the value's
      if (buf_.empty()) return final ? broken() : false;
      if (buf_[0] == '\n') buf_.erase(0, 1);
      xml_value_started_ = true;
    }
    const size_t close_at = buf_.find(kXmlParameterEnd);
    if (close_at == std::string::npos) {
      if (final) return broken();
      if (xml_string_value_) {  // all but what may be "\n</parameter>" or an unfinished character
        size_t hold = partial_suffix(buf_, kXmlParameterEnd);
        if (hold < buf_.size() && buf_[buf_.size() - hold - 1] == '\n') ++hold;
        hold += incomplete_utf8_tail(std::string_view(buf_).substr(0, buf_.size() - hold));
        append_arguments(json_string_body(std::string_view(buf_).substr(0, buf_.size() - hold)), out);
        buf_.erase(0, buf_.size() - hold);
      }
      return false;
    }
    std::string_view value = std::string_view(buf_).substr(0, close_at);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    append_arguments(xml_string_value_ ? json_string_body(value) + '"' : xml_value_json(xml_parameter_, value), out);
    buf_.erase(0, close_at + kXmlParameterEnd.size());
    xml_in_value_ = false;
    return true;
  }
  if (starts_with(rest, kXmlFunctionEnd)) {
    append_arguments("}", out);
    buf_.erase(0, i + kXmlFunctionEnd.size());
    close_call(/*complete=*/true, out);
    mode_ = Mode::kToolCallEnd;
    return true;
  }
  if (starts_with(rest, kXmlParameter)) {  // <parameter=NAME>\nVALUE\n</parameter>
    const size_t name_at = i + kXmlParameter.size();
    const size_t end = buf_.find('>', name_at);
    if (end == std::string::npos) return final ? broken() : false;
    xml_parameter_ = buf_.substr(name_at, end - name_at);
    if (xml_parameter_.empty()) return broken();
    std::string key = n_xml_parameters_++ > 0 ? "," : "";
    key += dump_compact(nlohmann::ordered_json(xml_parameter_));
    key += ':';
    const std::string* type = parameter_type(xml_parameter_);
    xml_string_value_ = type != nullptr && *type == "string";
    if (xml_string_value_) key += '"';  // a string streams as it comes
    append_arguments(key, out);
    buf_.erase(0, end + 1);
    xml_in_value_ = true;
    xml_value_started_ = false;
    return true;
  }
  if (!final && (is_partial(rest, kXmlFunctionEnd) || is_partial(rest, kXmlParameter))) return false;
  return broken();
}

bool OutputParser::step_mistral_calls(bool final, OutputDelta& out) {
  if (call_open_) {
    buf_.erase(0, reader_->read(buf_));
    if (final) reader_->finish();
    stream_arguments(out);
    if (reader_->status() == JsonCallReader::Status::kReading) return false;
    const bool complete = reader_->status() == JsonCallReader::Status::kComplete;
    close_call(out);
    if (!complete) {  // as the JSON forms: where the broken text ends is unknowable
      buf_.clear();
      mode_ = Mode::kDropRest;
      return false;
    }
    trim_content_ = true;  // content goes on; a next [TOOL_CALLS] opens the next call
    mode_ = Mode::kContent;
    return true;
  }
  // buf_ = "[TOOL_CALLS]" (or Granite's "<|tool_call|>") + what follows;
  // json_scan_ is just past the marker.
  auto give_up = [&](size_t upto) {  // [0, upto) is content, and the reply goes on as content
    emit_content(std::string_view(buf_).substr(0, upto), out);
    buf_.erase(0, upto);
    mode_ = Mode::kContent;
    return true;
  };
  const bool granite = starts_with(buf_, kGraniteCalls);
  size_t p = json_scan_;
  if (granite) {
    while (p < buf_.size() && is_space(buf_[p])) ++p;
  }
  if (p == buf_.size()) return final ? give_up(p) : false;
  if (granite && buf_[p] != '[') return give_up(p);  // Granite writes only the list
  if (buf_[p] == '[') {  // Mistral Nemo, Granite: a JSON array of {"name", "arguments"(, "id")} objects
    json_scan_ = p + 1;
    json_object_ = std::string::npos;
    json_any_call_ = false;
    json_array_ = true;
    mode_ = Mode::kJsonCalls;
    return true;
  }
  // name[ARGS]{...} or name[CALL_ID]id[ARGS]{...} (the id is the server's to give).
  size_t q = p;
  while (q < buf_.size() && buf_[q] != '[' && !is_space(buf_[q])) ++q;
  if (q == buf_.size()) return final ? give_up(q) : false;
  if (q == p || buf_[q] != '[') return give_up(q);
  const std::string_view rest = std::string_view(buf_).substr(q);
  size_t args_at = std::string::npos;
  if (starts_with(rest, kMistralArgs)) {
    args_at = q;
  } else if (starts_with(rest, kMistralCallId)) {
    args_at = buf_.find(kMistralArgs, q + kMistralCallId.size());
    if (args_at == std::string::npos) return final ? give_up(buf_.size()) : false;
  } else if (!final && (is_partial(rest, kMistralArgs) || is_partial(rest, kMistralCallId))) {
    return false;
  } else {
    return give_up(q);
  }
  const std::string name = buf_.substr(p, q - p);
  buf_.erase(0, args_at + kMistralArgs.size());
  json_scan_ = 0;
  reader_.emplace(JsonCallReader::arguments_only());
  open_call(name, out);
  return true;
}

void OutputParser::start_tool_call() {
  reader_.emplace(/*require_arguments=*/false);
  json_scan_ = 0;
  mode_ = Mode::kToolCall;
}

void OutputParser::open_call(const std::string& name, OutputDelta& out) {
  call_ = ToolCall{};
  call_.id = make_tool_call_id();
  call_.name = name;
  call_index_ = n_calls_++;
  call_open_ = true;
  saw_tool_calls_ = true;
  content_ws_.clear();  // whitespace before a call never shows
  trim_content_ = true;
  out.tool_call_deltas.push_back({call_index_, call_.id, call_.name, ""});
  if (reader_) stream_arguments(out);
}

void OutputParser::append_arguments(std::string_view piece, OutputDelta& out) {
  if (piece.empty()) return;
  call_.arguments += piece;
  std::vector<ToolCallDelta>& deltas = out.tool_call_deltas;
  if (!deltas.empty() && deltas.back().index == call_index_ && deltas.back().name.empty()) {
    deltas.back().arguments += piece;
  } else {
    deltas.push_back({call_index_, "", "", std::string(piece)});
  }
}

void OutputParser::stream_arguments(OutputDelta& out) {
  append_arguments(reader_->take_arguments(), out);
}

void OutputParser::close_call(OutputDelta& out) {
  close_call(reader_->status() == JsonCallReader::Status::kComplete, out);
}

void OutputParser::close_call(bool complete, OutputDelta& out) {
  // A call cut short before any arguments: no arguments, as a call without them has.
  if (!complete && call_.arguments.empty()) append_arguments("{}", out);
  out.tool_calls.push_back(std::move(call_));
  call_ = ToolCall{};
  call_open_ = false;
  reader_.reset();
}

void OutputParser::emit_content(std::string_view s, OutputDelta& out) {
  if (trim_content_) {
    size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    s.remove_prefix(i);
    if (s.empty()) return;
    trim_content_ = false;
  }
  if (!options_.parse_tool_calls) {
    out.content += s;
    return;
  }
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  if (end == 0) {
    content_ws_ += s;
    return;
  }
  out.content += content_ws_;
  out.content += s.substr(0, end);
  content_ws_.assign(s.substr(end));
}

void OutputParser::emit_reasoning(std::string_view s, OutputDelta& out) {
  if (trim_reasoning_) {
    size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    s.remove_prefix(i);
    if (s.empty()) return;
    trim_reasoning_ = false;
  }
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  if (end == 0) {
    reasoning_ws_ += s;
    return;
  }
  out.reasoning += reasoning_ws_;
  out.reasoning += s.substr(0, end);
  reasoning_ws_.assign(s.substr(end));
}

}  // namespace rill
