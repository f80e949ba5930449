// Tokenizer::from_tokenizer_json: Hugging Face tokenizer.json (+ optional
// tokenizer_config.json). The model's vocab and merges (hundreds of
// thousands of entries) are streamed out of a SAX parse instead of being
// built as a DOM, which keeps loading a 262k-entry vocabulary well under a
// second; the small rest of the file becomes a DOM.
#include <filesystem>
#include <fstream>

#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace rill {

namespace {

using nlohmann::json;

struct TokenizerJson {
  json rest;  // everything except model.vocab and model.merges
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool merges_malformed = false;
};

// SAX consumer: builds a DOM for `rest` and captures the two big members.
class TokenizerJsonSax : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonSax(TokenizerJson* out) : out_(out) {}

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return number(static_cast<int64_t>(v), json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(static_cast<int64_t>(v), json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool binary(binary_t&) override { return false; }
  bool string(string_t& v) override {
    if (capture_ == Capture::kMerges) {
      if (capture_depth_ == 1) {
        const size_t sp = v.find(' ');
        if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
          out_->merges_malformed = true;
        } else {
          out_->merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
        }
      } else if (capture_depth_ == 2) {
        pair_parts_.push_back(std::move(v));
      }
      return true;
    }
    if (capture_ == Capture::kVocab) return true;
    return value(json(std::move(v)));
  }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = "JSON error at byte " + std::to_string(position) + ": " + e.what();
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  enum class Capture { kNone, kVocab, kMerges };

  bool number(int64_t n, json v) {
    if (capture_ == Capture::kVocab) {
      if (capture_depth_ == 1) out_->vocab.emplace_back(std::move(key_), n);
      return true;
    }
    if (capture_ != Capture::kNone) return true;
    return value(std::move(v));
  }
  bool value(json v) {
    if (capture_ != Capture::kNone) return true;
    if (stack_.empty()) {
      out_->rest = std::move(v);
      return true;
    }
    json& parent = *stack_.back();
    if (parent.is_object())
      parent[key_] = std::move(v);
    else
      parent.push_back(std::move(v));
    return true;
  }
  bool open(json container) {
    if (capture_ != Capture::kNone) {
      ++capture_depth_;
      if (capture_ == Capture::kMerges && capture_depth_ == 2) pair_parts_.clear();
      return true;
    }
    // model.vocab / model.merges: the containers two levels below the root.
    if (stack_.size() == 2 && keys_.size() == 2 && keys_[1] == "model" && (key_ == "vocab" || key_ == "merges")) {
      capture_ = key_ == "vocab" ? Capture::kVocab : Capture::kMerges;
      capture_depth_ = 1;
      return true;
    }
    if (stack_.empty()) {
      out_->rest = std::move(container);
      stack_.push_back(&out_->rest);
      keys_.push_back("");
      return true;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(container);
      stack_.push_back(&slot);
      keys_.push_back(key_);
    } else {
      parent.push_back(std::move(container));
      stack_.push_back(&parent.back());
      keys_.push_back("");
    }
    return true;
  }
  bool close() {
    if (capture_ != Capture::kNone) {
      if (capture_ == Capture::kMerges && capture_depth_ == 2) {
        if (pair_parts_.size() == 2)
          out_->merges.emplace_back(std::move(pair_parts_[0]), std::move(pair_parts_[1]));
        else
          out_->merges_malformed = true;
      }
      if (--capture_depth_ == 0) capture_ = Capture::kNone;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerJson* out_;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // key under which each open container sits
  std::string key_;
  Capture capture_ = Capture::kNone;
  int capture_depth_ = 0;
  std::vector<std::string> pair_parts_;
  std::string error_;
};

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return Error{path + ": cannot open"};
  const std::streamoff size = f.tellg();
  if (size < 0) return Error{path + ": cannot read"};
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (!f.read(bytes.data(), size)) return Error{path + ": read error"};
  return bytes;
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::optional<std::string> token_string(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// <0xXX> with two hex digits (tokenizers' ByteFallback rule), else -1.
int byte_fallback_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// root[key] for a const object, or null when absent.
const json& member(const json& j, const char* key) {
  static const json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_tokenizer_json(const std::string& path) {
  RILL_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  TokenizerJson tj;
  TokenizerJsonSax sax(&tj);
  const bool parsed = json::sax_parse(bytes, &sax, json::input_format_t::json, true, false);
  if (!parsed) return Error{path + ": " + (sax.error().empty() ? "not valid JSON" : sax.error())};
  bytes.clear();
  bytes.shrink_to_fit();

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    const json& root = tj.rest;
    if (!root.is_object() || !root.contains("model")) return Error{path + ": no \"model\" object"};
    const json& model = root.at("model");
    const std::string type = model.value("type", "BPE");
    const bool wordpiece = type == "WordPiece";
    if (type != "BPE" && !wordpiece)
      return Error{path + ": model type '" + type + "' is not supported (BPE or WordPiece)"};
    if (tj.merges_malformed) return Error{path + ": model.merges has an entry that is not a pair"};

    // Vocabulary and added tokens.
    int64_t max_id = -1;
    for (const auto& [text, id] : tj.vocab) {
      if (id < 0 || id > (1 << 24)) return Error{path + ": vocab entry '" + text + "' has id " + std::to_string(id)};
      max_id = std::max(max_id, id);
    }
    std::vector<text::AddedToken> added;
    for (const auto& a : root.value("added_tokens", json::array())) {
      text::AddedToken tok;
      tok.content = a.at("content").get<std::string>();
      const int64_t id = a.at("id").get<int64_t>();
      if (id < 0 || id > (1 << 24))
        return Error{path + ": added token '" + tok.content + "' has id " + std::to_string(id)};
      tok.id = static_cast<int32_t>(id);
      tok.special = a.value("special", false);
      tok.lstrip = a.value("lstrip", false);
      tok.rstrip = a.value("rstrip", false);
      tok.single_word = a.value("single_word", false);
      max_id = std::max(max_id, id);
      added.push_back(std::move(tok));
    }
    if (max_id < 0) return Error{path + ": the vocabulary is empty"};
    const size_t n = static_cast<size_t>(max_id) + 1;
    t->token_text_.resize(n);
    t->flags_.assign(n, 0);
    t->vocab_.reserve(tj.vocab.size());
    for (auto& [text, id] : tj.vocab) {
      t->token_text_[id] = text;
      t->vocab_.emplace(text, static_cast<int32_t>(id));
    }
    for (const auto& a : added) {
      t->token_text_[a.id] = a.content;
      t->added_index_.insert_or_assign(a.content, a.id);
      if (a.special) t->flags_[a.id] |= kSpecial;
    }

    // Model.
    if (wordpiece) RILL_TRY(t->load_wordpiece(root, path));
    text::BpeOptions opt;
    opt.byte_fallback = model.value("byte_fallback", false);
    opt.fuse_unk = model.value("fuse_unk", false);
    opt.ignore_merges = model.value("ignore_merges", false);
    if (model.contains("unk_token") && model.at("unk_token").is_string()) {
      const std::string unk = model.at("unk_token").get<std::string>();
      opt.unk_id = text::find_token(t->vocab_, unk);
    }
    if (model.contains("continuing_subword_prefix") && model.at("continuing_subword_prefix").is_string())
      opt.continuing_subword_prefix = model.at("continuing_subword_prefix").get<std::string>();
    if (model.contains("end_of_word_suffix") && model.at("end_of_word_suffix").is_string())
      opt.end_of_word_suffix = model.at("end_of_word_suffix").get<std::string>();
    t->bpe_ = std::make_unique<text::BpeModel>(&t->vocab_, opt);
    t->bpe_->reserve_merges(tj.merges.size());
    for (size_t r = 0; r < tj.merges.size(); ++r)
      RILL_TRY(t->bpe_->add_merge(tj.merges[r].first, tj.merges[r].second, static_cast<int32_t>(r), true, path));

    // Normalizer.
    std::vector<const json*> norm_stack;
    if (!member(root, "normalizer").is_null()) norm_stack.push_back(&root.at("normalizer"));
    std::vector<const json*> norms;
    while (!norm_stack.empty()) {  // flatten Sequence, keeping order
      const json* j = norm_stack.front();
      norm_stack.erase(norm_stack.begin());
      if (j->value("type", "") == "Sequence") {
        const auto& inner = j->at("normalizers");
        for (size_t k = inner.size(); k-- > 0;) norm_stack.insert(norm_stack.begin(), &inner[k]);
      } else {
        norms.push_back(j);
      }
    }
    for (const json* j : norms) {
      const std::string nt = j->value("type", "");
      if (wordpiece && nt == "BertNormalizer") continue;  // load_wordpiece read it
      if (nt == "NFC") {
        t->normalizer_.push_back({NormalizerStep::Kind::kNfc, "", ""});
      } else if (nt == "Replace" && j->at("pattern").contains("String")) {
        t->normalizer_.push_back({NormalizerStep::Kind::kReplace, j->at("pattern").at("String").get<std::string>(),
                                  j->value("content", "")});
      } else if (nt == "Prepend") {
        t->normalizer_.push_back({NormalizerStep::Kind::kPrepend, "", j->value("prepend", "")});
      } else {
        return Error{path + ": normalizer '" + nt + "' is not supported"};
      }
    }

    // Pre-tokenizer.
    if (!wordpiece) {  // WordPiece: the BertPreTokenizer split is the model's own (load_wordpiece)
      RILL_ASSIGN_OR_RETURN(t->pre_tokenizer_, text::PreTokenizer::from_json(member(root, "pre_tokenizer"), path));
    }

    // Post-processor: the ids add_special adds around a single sequence.
    bool template_given = false;
    std::vector<const json*> procs;
    if (!member(root, "post_processor").is_null()) {
      const json& pp = root.at("post_processor");
      if (pp.value("type", "") == "Sequence") {
        for (const auto& p : pp.at("processors")) procs.push_back(&p);
      } else {
        procs.push_back(&pp);
      }
    }
    for (const json* p : procs) {
      const std::string pt = p->value("type", "");
      if (pt == "TemplateProcessing") {
        template_given = true;
        bool seen_sequence = false;
        for (const auto& item : p->at("single")) {
          if (item.contains("Sequence")) {
            seen_sequence = true;
            continue;
          }
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          const auto& spec = p->at("special_tokens").at(name);
          for (const auto& id : spec.at("ids"))
            (seen_sequence ? t->suffix_ids_ : t->prefix_ids_).push_back(id.get<int32_t>());
        }
      } else if (pt == "RobertaProcessing" || pt == "BertProcessing") {
        template_given = true;
        t->prefix_ids_.push_back(p->at("cls").at(1).get<int32_t>());
        t->suffix_ids_.push_back(p->at("sep").at(1).get<int32_t>());
      } else if (pt != "ByteLevel") {
        return Error{path + ": post_processor '" + pt + "' is not supported"};
      }
    }

    // tokenizer_config.json: BOS/EOS strings and add_bos_token.
    const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
    json config = json::object();
    if (std::filesystem::exists(config_path)) {
      RILL_ASSIGN_OR_RETURN(std::string cbytes, read_file(config_path));
      config = json::parse(cbytes, nullptr, false);
      if (config.is_discarded() || !config.is_object()) return Error{config_path + ": not valid JSON"};
    }
    if (auto bos = token_string(config, "bos_token")) t->bos_id_ = t->token_id(*bos);
    if (auto eos = token_string(config, "eos_token")) t->eos_id_ = t->token_id(*eos);
    if (!template_given) {  // no template: the config's flags decide (transformers' rule)
      if (config.value("add_bos_token", false) && t->bos_id_) t->prefix_ids_.push_back(*t->bos_id_);
      if (config.value("add_eos_token", false) && t->eos_id_) t->suffix_ids_.push_back(*t->eos_id_);
    }
    if (!t->bos_id_ && !t->prefix_ids_.empty()) t->bos_id_ = t->prefix_ids_.front();

    // Decoder: how each token's text becomes bytes.
    bool byte_level = false, byte_fallback = false;
    std::vector<std::pair<std::string, std::string>> replacements;
    std::vector<const json*> decs;
    if (!member(root, "decoder").is_null()) {
      const json& d = root.at("decoder");
      if (d.value("type", "") == "Sequence") {
        for (const auto& x : d.at("decoders")) decs.push_back(&x);
      } else {
        decs.push_back(&d);
      }
    }
    for (const json* d : decs) {
      const std::string dt = d->value("type", "");
      if (dt == "ByteLevel") {
        byte_level = true;
      } else if (dt == "ByteFallback") {
        byte_fallback = true;
      } else if (dt == "Fuse") {
      } else if (dt == "Replace" && d->at("pattern").contains("String")) {
        replacements.emplace_back(d->at("pattern").at("String").get<std::string>(), d->value("content", ""));
      } else if (dt == "Strip" && d->value("content", "") == " " && d->value("start", 0) == 1 &&
                 d->value("stop", 0) == 0) {
        t->leading_space_ = LeadingSpace::kOutputStart;
      } else if (dt == "WordPiece" && wordpiece) {
        // "##x" continues the word; any other token starts one after a space
        // (the reference's cleanup of spaces before punctuation is not done).
        t->leading_space_ = LeadingSpace::kOutputStart;
      } else if (dt == "Metaspace") {
        replacements.emplace_back(d->value("replacement", "\xE2\x96\x81"), " ");
        if (d->value("prepend_scheme", "always") != "never" && d->value("add_prefix_space", true))
          t->leading_space_ = LeadingSpace::kOutputStart;
      } else {
        return Error{path + ": decoder '" + dt + "' is not supported"};
      }
    }
    t->decode_style_ = byte_fallback ? DecodeStyle::kByteFallbackRuns : DecodeStyle::kByteStream;
    std::string piece;
    for (size_t id = 0; id < n; ++id) {
      const std::string& tt = t->token_text_[id];
      piece.clear();
      bool mapped = byte_level;
      if (byte_level) {
        for (size_t i = 0; i < tt.size() && mapped;) {
          const text::Utf8Probe p = text::probe_utf8(std::string_view(tt).substr(i, 4));
          const int b = p.complete ? text::unicode_to_byte(p.cp) : -1;
          if (b < 0)
            mapped = false;
          else
            piece.push_back(static_cast<char>(b));
          i += p.complete ? p.valid_prefix_len : 1;
        }
      }
      if (!mapped) piece = tt;  // tokenizers keeps a token with unmapped chars as is
      if (wordpiece && !(t->flags_[id] & kSpecial))
        piece = piece.starts_with(t->wordpiece_prefix_) ? piece.substr(t->wordpiece_prefix_.size()) : " " + piece;
      for (const auto& [from, to] : replacements) {
        if (from.empty()) continue;
        for (size_t pos = piece.find(from); pos != std::string::npos; pos = piece.find(from, pos + to.size()))
          piece.replace(pos, from.size(), to);
      }
      int byte_value = byte_fallback ? byte_fallback_value(piece) : -1;
      if (byte_value >= 0) piece.assign(1, static_cast<char>(byte_value));
      t->set_piece(static_cast<int32_t>(id), piece, byte_value);
    }

    t->added_.build(std::move(added), text::AddedTokenMatcher::Rule::kLeftmostLongest);
    t->finish_eos_ids();

    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, wordpiece ? "tokenizer.json/wp" : "tokenizer.json/bpe", wordpiece ? 17 : 18);
    for (const auto& tt : t->token_text_) XXH3_64bits_update(st, tt.data(), tt.size() + 1);  // + NUL
    for (const auto& [a, b] : tj.merges) {
      XXH3_64bits_update(st, a.data(), a.size() + 1);
      XXH3_64bits_update(st, b.data(), b.size() + 1);
    }
    XXH3_64bits_update(st, t->flags_.data(), t->flags_.size());
    const std::string settings = member(root, "normalizer").dump() + member(root, "pre_tokenizer").dump() +
                                 member(root, "post_processor").dump() + member(root, "decoder").dump() +
                                 model.dump();  // model without vocab/merges: options only
    XXH3_64bits_update(st, settings.data(), settings.size());
    t->fingerprint_ = hex64(XXH3_64bits_digest(st));
    XXH3_freeState(st);
  } catch (const json::exception& e) {
    return Error{path + ": unexpected structure: " + e.what()};
  }
  RILL_TRY(t->validate(path));
  return t;
}

Status Tokenizer::load_wordpiece(const json& root, const std::string& path) {
  const json& model = root.at("model");
  text::WordPieceOptions opt;
  const std::string unk = model.value("unk_token", "[UNK]");
  const auto unk_id = text::find_token(vocab_, unk);
  if (!unk_id) return Error{path + ": WordPiece unk_token '" + unk + "' is not in the vocabulary"};
  opt.unk_id = *unk_id;
  opt.continuing_subword_prefix = model.value("continuing_subword_prefix", "##");
  opt.max_input_chars_per_word = model.value("max_input_chars_per_word", 100);
  const json& norm = member(root, "normalizer");
  if (norm.is_null()) {
    opt.clean_text = opt.handle_chinese_chars = opt.strip_accents = opt.lowercase = false;
  } else {
    if (norm.value("type", "") != "BertNormalizer")
      return Error{path + ": a WordPiece model needs the BertNormalizer (or none), not '" + norm.value("type", "") +
                   "'"};
    opt.clean_text = norm.value("clean_text", true);
    opt.handle_chinese_chars = norm.value("handle_chinese_chars", true);
    opt.lowercase = norm.value("lowercase", true);
    const json& strip = member(norm, "strip_accents");
    opt.strip_accents = strip.is_boolean() ? strip.get<bool>() : opt.lowercase;  // null: as lowercase
  }
  const json& pre = member(root, "pre_tokenizer");
  if (!pre.is_null() && pre.value("type", "") != "BertPreTokenizer")
    return Error{path + ": a WordPiece model needs the BertPreTokenizer, not '" + pre.value("type", "") + "'"};
  wordpiece_prefix_ = opt.continuing_subword_prefix;
  model_kind_ = ModelKind::kWordPiece;
  wordpiece_ = std::make_unique<text::WordPieceModel>(vocab_, std::move(opt));
  return Status::Ok();
}

}  // namespace rill
