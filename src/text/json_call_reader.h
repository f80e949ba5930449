#pragma once
// JsonCallReader: reads one tool call object {"name": ..., "arguments" |
// "parameters": ...} as the model writes it, byte by byte, so the call can
// stream: the name once its string has closed, the arguments text as soon
// as each piece of it is decided.
//
// It accepts exactly the JSON nlohmann accepts (RFC 8259: strings with valid
// UTF-8 and no raw control characters, escapes with paired surrogates,
// numbers without leading zeros) nested at most kMaxJsonDepth containers,
// the call object included, as parse_json does. Leading whitespace before
// the '{' is skipped; reading stops at the object's closing '}'.
//
// The arguments text is what parse_tool_call_json gives for the same object:
//   object value  nlohmann's compact dump of it, produced piece by piece
//                 (whitespace dropped, strings re-escaped as nlohmann writes
//                 them, each number re-formatted by nlohmann once it ends).
//                 One difference: an object with a duplicate key keeps every
//                 member here, where nlohmann keeps one.
//   string value  the decoded string (JSON text, as the model wrote it).
//   null / none   "{}" when arguments are optional, once the object ends.
// The first "arguments" or "parameters" key is the arguments (a later one
// of either is an ordinary member), and the first "name" key the name.
// A multi-byte character or escape is held until complete, so every piece
// is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rill {

class JsonCallReader {
 public:
  enum class Status {
    kReading,   // needs more text
    kComplete,  // the object ended and is a call (name() and all the arguments known)
    kInvalid,   // not JSON, or a JSON object that is not a call
  };

  // `require_arguments`: the JSON answer forms (Llama-3, rill's generic
  // format), where an object without arguments is an answer, not a call.
  explicit JsonCallReader(bool require_arguments) : require_arguments_(require_arguments) {}

  // A reader of a bare arguments value (an object, or a string of JSON
  // text), for formats that write the name outside the JSON (Mistral's
  // name[ARGS]{...}): a call as soon as the value begins; name() stays "".
  static JsonCallReader arguments_only() {
    JsonCallReader r(false);
    r.arguments_only_ = true;
    return r;
  }

  // Reads from `text` until the object ends or turns invalid; returns the
  // bytes consumed (on kInvalid, the offending byte is not counted).
  size_t read(std::string_view text);
  // No more text comes: a reader still reading becomes kInvalid.
  void finish();

  Status status() const { return status_; }
  // The text is a call, whatever follows: the name string has closed (and
  // is not empty) and, when arguments are required, their value has begun
  // as an object or a string. Stays true once true (even if the text later
  // turns invalid).
  bool is_call() const { return is_call_; }
  const std::string& name() const { return name_; }
  // The arguments text decided since the last take (everything on kComplete).
  std::string take_arguments();
  // Whether any arguments text was decided so far (taken or not).
  bool any_arguments() const { return !arguments_.empty(); }

 private:
  enum class Expect { kObjectOpen, kKeyOrClose, kKey, kColon, kValue, kValueOrClose, kCommaOrClose, kDone };
  enum class Role { kOther, kName, kArguments };
  // Where a string's decoded characters go.
  enum class Sink { kNone, kKey, kName, kArgumentsText, kArgumentsJson };

  bool step(char c);  // false: invalid at c
  bool begin_value(char c);
  bool end_value();  // a value (scalar or container) completed
  bool string_byte(unsigned char c);
  bool escape_byte(char c);
  bool string_end();
  bool number_end();
  void emit_codepoint(uint32_t cp);        // a decoded character of the current string, to its sink
  void emit_bytes(std::string_view utf8);  // a whole multi-byte character, to the sink
  void update_is_call();
  void complete_object();
  bool complete_arguments_only();
  bool capturing() const { return capture_depth_ > 0; }

  bool require_arguments_;
  bool arguments_only_ = false;
  Status status_ = Status::kReading;
  bool is_call_ = false;
  Expect expect_ = Expect::kObjectOpen;
  std::vector<char> stack_;         // '{' or '['
  Role value_role_ = Role::kOther;  // role of the next value at the call object's level
  std::string key_;                 // the call object's current key

  // String state.
  bool in_string_ = false, string_is_key_ = false;
  Sink sink_ = Sink::kNone;
  int escape_ = 0;  // 0 none, 1 after '\', 2..5 reading \u hex digits (count + 2)
  uint32_t hex_ = 0;
  uint32_t high_surrogate_ = 0;                    // a \uD800-\uDBFF waiting for its low half
  bool want_low_ = false;                          // after a high surrogate: the next must be "\u" + a low one
  std::string utf8_;                               // bytes of a multi-byte character so far
  int utf8_need_ = 0;                              // continuation bytes still expected
  unsigned char utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // range of the next continuation byte

  std::string number_;   // the number being read (ends at a delimiter)
  std::string literal_;  // "true" / "false" / "null" being read
  size_t literal_pos_ = 0;

  // Call fields.
  bool have_name_key_ = false, have_arguments_key_ = false;
  bool name_done_ = false;
  bool arguments_begun_ = false;  // the arguments value began as an object or a string
  bool arguments_null_ = false;
  std::string name_;
  size_t capture_depth_ = 0;  // stack depth of the arguments object while it is read; 0 otherwise
  std::string arguments_;     // decided arguments text
  size_t n_taken_ = 0;        // bytes of arguments_ already taken
};

}  // namespace rill
