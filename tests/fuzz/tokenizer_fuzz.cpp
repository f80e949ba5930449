// Fuzz target for the tokenizers and the incremental detokenizer. Four
// small tokenizers are built once: a byte-level BPE tokenizer.json (NFC,
// Llama-3 split regex, added tokens), a SentencePiece-style tokenizer.json
// (byte fallback, Prepend/Replace normalizer, Strip decoder), a GGUF
// "llama" (SPM) vocabulary parsed from memory and a WordPiece
// tokenizer.json (BertNormalizer, BertPreTokenizer, [CLS]/[SEP] template).
// Input: byte 0 = flags (bit0 add_special, bit1 parse_special, bit2
// skip_special, bits 3-4 tokenizer), the rest = text, also read as ids.
// Checks: ids in range, decode output valid UTF-8, IncrementalDecoder output
// equal to decode(), byte-level round trip equal to the lossy input.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "loader/gguf.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

using nlohmann::json;

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

std::string byte_char(int b) {
  std::string s;
  rill::text::append_utf8(s, rill::text::byte_to_unicode()[b]);
  return s;
}

json byte_level_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"Ġ", "t"}, {"h", "e"},   {"Ġt", "he"}, {"i", "n"},  {"Ġ", "a"}, {"e", "r"}, {"o", "n"}, {"r", "e"},
      {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"Ċ", "Ċ"},   {"in", "g"}, {"Ġ", "s"}, {"a", "n"}, {"Ã", "©"}, {"1", "2"}};
  json merges = json::array();
  int next = 256;
  for (const auto& [a, b] : pairs) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merges.push_back(json::array({a, b}));
  }
  json added = json::array();
  added.push_back({{"id", next},
                   {"content", "<s>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  added.push_back({{"id", next + 1},
                   {"content", "<|im_start|>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  added.push_back({{"id", next + 2},
                   {"content", "<think>"},
                   {"special", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens",
         {{"<s>", {{"id", "<s>"}, {"ids", json::array({next})}, {"tokens", json::array({"<s>"})}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"ignore_merges", true}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}},
  };
}

json sentencepiece_json() {
  const std::string ws = "\xE2\x96\x81";
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  int next = 3;
  char name[8];
  for (int b = 0; b < 256; ++b) std::snprintf(name, sizeof(name), "<0x%02X>", b), vocab[name] = next++;
  for (const char* t : {"a", "b", "c", "e", "h", "t", "\xC3\xA9"}) vocab[t] = next++;
  vocab[ws] = next++;
  json merges = json::array();
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {ws, "t"}, {"h", "e"}, {ws + "t", "he"}, {"a", "b"}, {ws, "a"}, {ws, ws}}) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merges.push_back(json::array({a, b}));
  }
  json added = json::array();
  added.push_back({{"id", 1},
                   {"content", "<s>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  added.push_back({{"id", next},
                   {"content", "<mask>"},
                   {"special", true},
                   {"lstrip", true},
                   {"rstrip", true},
                   {"single_word", false},
                   {"normalized", false}});
  return {
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", ws}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", ws}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", ws}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"unk_token", "<unk>"},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

json wordpiece_json() {
  json vocab = json::object();
  int next = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",       "a",     "b",      "e",     "h",     "l",
                        "o",     "w",     "r",     "d",     "un",           "##aff", "##able", "hello", "world", "##s",
                        "##e",   "!",     ",",     ".",     "\xE6\x97\xA5", "cafe"})
    vocab[t] = next++;
  json added = json::array();
  for (int id = 0; id < 5; ++id) {
    std::string content;
    for (const auto& [k, v] : vocab.items())
      if (v == id) content = k;
    added.push_back({{"id", id},
                     {"content", content},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}});
  }
  auto special = [&](const char* name, int id) {
    return json{{"id", name}, {"ids", json::array({id})}, {"tokens", json::array({name})}};
  };
  return {
      {"added_tokens", added},
      {"normalizer",
       {{"type", "BertNormalizer"},
        {"clean_text", true},
        {"handle_chinese_chars", true},
        {"strip_accents", nullptr},
        {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"[CLS]", special("[CLS]", 2)}, {"[SEP]", special("[SEP]", 3)}}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model",
       {{"type", "WordPiece"},
        {"unk_token", "[UNK]"},
        {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100},
        {"vocab", vocab}}},
  };
}

// A GGUF image with only tokenizer metadata (SPM vocabulary with scores).
std::vector<uint8_t> spm_gguf() {
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  auto u32 = [&](uint32_t x) { put(&x, 4); };
  auto u64 = [&](uint64_t x) { put(&x, 8); };
  auto str = [&](const std::string& s) { u64(s.size()), put(s.data(), s.size()); };
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  char name[8];
  for (int b = 0; b < 256; ++b)
    std::snprintf(name, sizeof(name), "<0x%02X>", b), tokens.push_back(name), types.push_back(6);
  const std::string ws = "\xE2\x96\x81";
  for (const std::string& t :
       {ws, std::string("a"), std::string("b"), std::string("t"), std::string("h"), std::string("e"), ws + "t",
        std::string("he"), ws + "the", ws + "a", std::string("ab"), ws + ws}) {
    tokens.push_back(t), types.push_back(1);
  }
  tokens.push_back("<user>"), types.push_back(4);
  std::vector<float> scores;
  for (size_t i = 0; i < tokens.size(); ++i) scores.push_back(-static_cast<float>(i));
  u32(0x46554747), u32(3), u64(0), u64(4);
  str("tokenizer.ggml.model"), u32(8), str("llama");
  str("tokenizer.ggml.tokens"), u32(9), u32(8), u64(tokens.size());
  for (const auto& t : tokens) str(t);
  str("tokenizer.ggml.token_type"), u32(9), u32(5), u64(types.size());
  for (int32_t t : types) put(&t, 4);
  str("tokenizer.ggml.scores"), u32(9), u32(6), u64(scores.size());
  for (float s : scores) put(&s, 4);
  while (out.size() % 32) out.push_back(0);
  return out;
}

std::unique_ptr<rill::Tokenizer> load_json(const json& j) {
  char dir[] = "/tmp/rill_tok_fuzz_XXXXXX";
  if (mkdtemp(dir) == nullptr) std::abort();
  const std::string path = std::string(dir) + "/tokenizer.json";
  std::ofstream(path) << j.dump();
  auto t = rill::Tokenizer::from_tokenizer_json(path);
  std::filesystem::remove_all(dir);
  if (!t.ok()) {
    std::fprintf(stderr, "fuzz setup: %s\n", t.error().message.c_str());
    std::abort();
  }
  return std::move(t).value();
}

struct Tokenizers {
  std::unique_ptr<rill::Tokenizer> t[4];
  Tokenizers() {
    t[0] = load_json(byte_level_json());
    t[1] = load_json(sentencepiece_json());
    const std::vector<uint8_t> image = spm_gguf();
    auto gguf = rill::GgufFile::parse(image.data(), image.size(), "fuzz.gguf");
    if (!gguf.ok()) std::fprintf(stderr, "fuzz setup: %s\n", gguf.error().message.c_str()), std::abort();
    auto spm = rill::Tokenizer::from_gguf(*gguf.value());
    if (!spm.ok()) std::fprintf(stderr, "fuzz setup: %s\n", spm.error().message.c_str()), std::abort();
    t[2] = std::move(spm).value();
    t[3] = load_json(wordpiece_json());
  }
};

void check_decode(const rill::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  const std::string text = tok.decode(ids, skip);
  FUZZ_CHECK(rill::text::is_valid_utf8(text));
  rill::IncrementalDecoder dec(tok, skip);
  std::string streamed;
  for (int32_t id : ids) {
    const size_t before = streamed.size();
    dec.push(id, streamed);
    FUZZ_CHECK(rill::text::is_valid_utf8(std::string_view(streamed).substr(before)));
  }
  dec.flush(streamed);
  FUZZ_CHECK(streamed == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizers tokenizers;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const bool add_special = flags & 1, parse_special = flags & 2, skip_special = flags & 4;
  const int which = (flags >> 3) & 3;
  const rill::Tokenizer& tok = *tokenizers.t[which];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
  check_decode(tok, ids, skip_special);
  if (which == 0 && !add_special) {  // byte-level BPE without normalizer is lossless
    FUZZ_CHECK(tok.decode(ids, false) == rill::text::utf8_lossy(text));
  }

  // The same bytes as arbitrary ids (negative and out of range included).
  std::vector<int32_t> raw_ids;
  for (size_t k = 1; k + 1 < size; k += 2) {
    const int32_t v = static_cast<int8_t>(data[k + 1]) * 256 + data[k];
    raw_ids.push_back(v % (tok.n_vocab() + 8));
  }
  check_decode(tok, raw_ids, skip_special);
  for (int32_t id : raw_ids) (void)tok.token_to_piece(id);
  return 0;
}
