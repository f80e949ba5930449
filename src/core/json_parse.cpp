#include "core/json_parse.h"

#include <unordered_map>
#include <utility>
#include <vector>

namespace rill {
namespace {

using Json = nlohmann::ordered_json;

// Keys longer than this are cut in paths (at a UTF-8 boundary: paths go
// into error bodies that must stay valid UTF-8).
constexpr size_t kMaxPathKeyBytes = 64;
constexpr size_t kMaxPathBytes = 256;  // longer paths keep their first and last 128 bytes
// Objects up to this many keys check duplicates by scanning; larger ones
// build a hash index (most request objects have a handful of keys).
constexpr size_t kLinearKeyScan = 8;

std::string_view utf8_prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] starts the cut code point
  return s.substr(0, n);
}

// Non-ASCII bytes become '?': nlohmann's messages are ASCII but for quoted
// input, and error bodies must be valid UTF-8.
std::string ascii_only(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) c = '?';
  }
  return s;
}

// One open container while parsing. Members are collected in a plain vector
// (noexcept moves) and turned into the ordered_json at its end, so no insert
// scans or deep copies happen on growth.
struct Frame {
  bool is_object = false;
  std::vector<Json> items;                            // arrays
  std::vector<std::pair<std::string, Json>> members;  // objects, in first-seen order
  std::unordered_map<std::string, size_t> index;      // key -> members position, once large
  std::string key;                                    // objects: the key of the value being read
};

class DomBuilder final : public nlohmann::json_sax<Json> {
 public:
  explicit DomBuilder(const JsonParseOptions& o) : options_(o) {}

  bool null() override { return add(Json(nullptr)); }
  bool boolean(bool v) override { return add(Json(v)); }
  bool number_integer(number_integer_t v) override { return add(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add(Json(v)); }
  bool string(string_t& v) override { return add(Json(std::move(v))); }
  bool binary(binary_t&) override { return fail_syntax("binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(true); }
  bool key(string_t& k) override {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error_.message.empty()) {
      // nlohmann's what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
      std::string what = ex.what();
      if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
      // "; last read: '...'" quotes raw input (maybe invalid UTF-8, maybe
      // huge); the line and column say where.
      if (auto p = what.find("; last read:"); p != std::string::npos) what.resize(p);
      what = ascii_only(std::move(what));
      error_.kind = JsonParseError::Kind::kSyntax;
      error_.message = "not valid JSON: " + what;  // what says line and column
      (void)position;
    }
    return false;
  }

  bool failed() const { return !error_.message.empty(); }
  JsonParseError take_error() { return std::move(error_); }
  Json take_result() { return std::move(result_); }

 private:
  bool fail_syntax(const char* what) {
    error_.kind = JsonParseError::Kind::kSyntax;
    error_.message = std::string("not valid JSON: ") + what;
    return false;
  }

  // The path of the value being read now (the one about to be added).
  std::string current_path() const {
    std::string path(options_.base_path);
    for (const Frame& f : stack_) {
      if (f.is_object) {
        std::string_view k = utf8_prefix(f.key, kMaxPathKeyBytes);
        path = json_path_key(path, k);
        if (k.size() < f.key.size()) path += "...";
      } else {
        path = json_path_index(path, f.items.size());
      }
    }
    if (path.size() > kMaxPathBytes) {  // keep error bodies small: the start and the end
      const std::string_view head = utf8_prefix(path, kMaxPathBytes / 2);
      size_t tail = path.size() - kMaxPathBytes / 2;
      while (tail < path.size() && (static_cast<unsigned char>(path[tail]) & 0xC0) == 0x80) ++tail;
      path = std::string(head) + "..." + path.substr(tail);
    }
    return path;
  }

  bool open(bool is_object) {
    if (static_cast<int>(stack_.size()) >= options_.max_depth) {
      error_.kind = JsonParseError::Kind::kTooDeep;
      error_.path = current_path();
      const std::string where = error_.path.empty() ? std::string("the JSON value") : error_.path;
      error_.message = where + ": nested deeper than " + std::to_string(options_.max_depth) +
                       " levels (the limit for JSON in a request)";
      return false;
    }
    stack_.emplace_back();
    stack_.back().is_object = is_object;
    return true;
  }

  bool close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    Json value;
    if (f.is_object) {
      value = Json::object();
      auto& obj = value.get_ref<Json::object_t&>();
      obj.reserve(f.members.size());
      // The base vector's emplace_back: the keys are unique already.
      for (auto& [k, v] : f.members) obj.Json::object_t::Container::emplace_back(std::move(k), std::move(v));
    } else {
      value = Json(std::move(f.items));
    }
    return add(std::move(value));
  }

  bool add(Json&& v) {
    if (stack_.empty()) {
      result_ = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (!f.is_object) {
      f.items.push_back(std::move(v));
      return true;
    }
    if (f.members.size() < kLinearKeyScan) {
      for (auto& m : f.members) {
        if (m.first == f.key) {
          m.second = std::move(v);  // duplicate: last value wins, first position stays
          return true;
        }
      }
    } else {
      if (f.index.empty()) {
        for (size_t i = 0; i < f.members.size(); ++i) f.index.emplace(f.members[i].first, i);
      }
      auto [it, inserted] = f.index.emplace(f.key, f.members.size());
      if (!inserted) {
        f.members[it->second].second = std::move(v);
        return true;
      }
    }
    f.members.emplace_back(std::move(f.key), std::move(v));
    return true;
  }

  const JsonParseOptions& options_;
  std::vector<Frame> stack_;
  Json result_;
  JsonParseError error_;
};

}  // namespace

std::string json_path_key(std::string_view base, std::string_view key) {
  std::string out(base);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

std::string json_path_index(std::string_view base, size_t index) {
  std::string out(base);
  out += '[';
  out += std::to_string(index);
  out += ']';
  return out;
}

std::variant<nlohmann::ordered_json, JsonParseError> parse_json(std::string_view text,
                                                                const JsonParseOptions& options) {
  DomBuilder builder(options);
  const bool ok = Json::sax_parse(text, &builder, nlohmann::json::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (!ok || builder.failed()) {
    JsonParseError e = builder.take_error();
    if (e.message.empty()) e.message = "not valid JSON";
    return e;
  }
  return builder.take_result();
}

}  // namespace rill
