// Tokenizer::from_gguf: the tokenizer.ggml.* metadata, interpreted as
// llama.cpp does (llama-vocab.cpp): token types decide what is special, the
// pre-tokenizer name picks the regex cascade, add_bos defaults per type.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <xxhash.h>

#include "loader/gguf.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace rill {

namespace {

// tokenizer.ggml.token_type values.
enum GgufTokenType : int64_t {
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string where = gguf.path().empty() ? std::string("GGUF") : gguf.path();
  const std::string model = gguf.get_string("tokenizer.ggml.model").value_or("");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  if (model == "gpt2") {
    t->model_kind_ = ModelKind::kBpe;
  } else if (model == "llama") {
    t->model_kind_ = ModelKind::kSpm;
  } else {
    return Error{where + ": tokenizer.ggml.model '" + model + "' is not supported (gpt2 or llama)"};
  }

  const GgufArray* tokens = gguf.get_array("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty()) return Error{where + ": tokenizer.ggml.tokens is missing"};
  const size_t n = tokens->size();
  const GgufArray* types = gguf.get_array("tokenizer.ggml.token_type");
  const GgufArray* scores = gguf.get_array("tokenizer.ggml.scores");
  if (types && types->size() != n) return Error{where + ": tokenizer.ggml.token_type has the wrong length"};
  if (scores && scores->size() != n) return Error{where + ": tokenizer.ggml.scores has the wrong length"};

  std::vector<int64_t> type(n, kTypeNormal);
  std::vector<float> score(n, 0.0f);
  t->token_text_.resize(n);
  t->flags_.assign(n, 0);
  t->vocab_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string* s = (*tokens)[i].as_string();
    if (s == nullptr) return Error{where + ": tokenizer.ggml.tokens[" + std::to_string(i) + "] is not a string"};
    t->token_text_[i] = s->empty() ? "[EMPTY_" + std::to_string(i) + "]" : *s;
    t->vocab_.insert_or_assign(t->token_text_[i], static_cast<int32_t>(i));
    if (types) type[i] = (*types)[i].as_int().value_or(kTypeNormal);
    if (scores) score[i] = static_cast<float>((*scores)[i].as_float().value_or(0.0));
  }

  // Defaults per model type, then the file's keys (llama.cpp's order).
  bool add_bos = false, add_eos = false;
  std::optional<int64_t> bos, eos, unk;
  const std::string pre = gguf.get_string("tokenizer.ggml.pre").value_or("");
  if (t->model_kind_ == ModelKind::kSpm) {
    bos = 1, eos = 2, unk = 0;
    add_bos = true;
    t->spm_add_space_prefix_ = true;
  } else {
    bos = 11, eos = 11;
    add_bos = pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "tekken" ||
              pre == "chameleon";
  }
  auto key_id = [&](const char* key, std::optional<int64_t>& id) {
    if (auto v = gguf.get_int(key); v && *v >= 0 && static_cast<size_t>(*v) < n) id = *v;
  };
  key_id("tokenizer.ggml.bos_token_id", bos);
  key_id("tokenizer.ggml.eos_token_id", eos);
  key_id("tokenizer.ggml.unknown_token_id", unk);
  std::optional<int64_t> eot, eom;
  key_id("tokenizer.ggml.eot_token_id", eot);
  key_id("tokenizer.ggml.eom_token_id", eom);
  if (auto v = gguf.get_int("tokenizer.ggml.add_bos_token")) add_bos = *v != 0;
  if (auto v = gguf.get_int("tokenizer.ggml.add_eos_token")) add_eos = *v != 0;
  if (auto v = gguf.get_int("tokenizer.ggml.add_space_prefix")) t->spm_add_space_prefix_ = *v != 0;
  if (bos && static_cast<size_t>(*bos) < n) t->bos_id_ = static_cast<int32_t>(*bos);
  if (eos && static_cast<size_t>(*eos) < n) t->eos_id_ = static_cast<int32_t>(*eos);
  if (add_bos) {
    if (!t->bos_id_) return Error{where + ": add_bos_token is set but there is no BOS token"};
    t->prefix_ids_.push_back(*t->bos_id_);
  }
  if (add_eos) {
    if (!t->eos_id_) return Error{where + ": add_eos_token is set but there is no EOS token"};
    t->suffix_ids_.push_back(*t->eos_id_);
  }

  // llama.cpp treats these end-of-turn names as control tokens whatever their type.
  for (std::string_view name :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"}) {
    if (auto id = text::find_token(t->vocab_, name)) type[*id] = kTypeControl;
  }

  // Model.
  if (t->model_kind_ == ModelKind::kBpe) {
    bool ignore_merges = false;
    RILL_ASSIGN_OR_RETURN(t->pre_tokenizer_, text::PreTokenizer::for_gguf_pre(pre, &ignore_merges));
    text::BpeOptions opt;
    opt.ignore_merges = ignore_merges;
    t->bpe_ = std::make_unique<text::BpeModel>(&t->vocab_, opt);
    const GgufArray* merges = gguf.get_array("tokenizer.ggml.merges");
    if (merges == nullptr) return Error{where + ": tokenizer.ggml.merges is missing"};
    t->bpe_->reserve_merges(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string* s = (*merges)[r].as_string();
      const size_t sp = s ? s->find(' ', 1) : std::string::npos;
      if (sp == std::string::npos) continue;  // llama.cpp: such a merge can never apply
      // A merge naming unknown tokens can never apply either; skip it.
      (void)t->bpe_->add_merge(std::string_view(*s).substr(0, sp), std::string_view(*s).substr(sp + 1),
                               static_cast<int32_t>(r), false, where);
    }
  } else {
    t->spm_ = std::make_unique<text::SpmModel>(&t->vocab_, score,
                                               unk ? std::optional<int32_t>(static_cast<int32_t>(*unk)) : std::nullopt);
    if (t->spm_add_space_prefix_) t->leading_space_ = LeadingSpace::kFirstToken;
  }

  // Special tokens: control/unknown need parse_special; user-defined always match.
  std::vector<text::AddedToken> added;
  for (size_t i = 0; i < n; ++i) {
    const bool control = type[i] == kTypeControl || type[i] == kTypeUnknown;
    if (control) t->flags_[i] |= kSpecial;
    if (control || type[i] == kTypeUserDefined) {
      text::AddedToken tok;
      tok.content = t->token_text_[i];
      tok.id = static_cast<int32_t>(i);
      tok.special = control;
      added.push_back(std::move(tok));
    }
  }
  t->added_.build(std::move(added), text::AddedTokenMatcher::Rule::kLongestFirst);

  // Pieces (llama.cpp token_to_piece with special = true).
  t->decode_style_ = DecodeStyle::kByteStream;
  std::string piece;
  for (size_t i = 0; i < n; ++i) {
    const std::string& tt = t->token_text_[i];
    piece.clear();
    switch (type[i]) {
      case kTypeControl:
      case kTypeUnknown:
      case kTypeUserDefined:
        piece = tt;
        break;
      case kTypeNormal:
        if (t->model_kind_ == ModelKind::kSpm) {
          for (size_t k = 0; k < tt.size(); ++k) {
            if (tt.compare(k, 3, "\xE2\x96\x81") == 0)
              piece += ' ', k += 2;
            else
              piece += tt[k];
          }
        } else {
          for (size_t k = 0; k < tt.size();) {
            const text::Utf8Probe p = text::probe_utf8(std::string_view(tt).substr(k, 4));
            const size_t len = p.valid_prefix_len == 0 ? 1 : p.valid_prefix_len;
            const int b = p.complete ? text::unicode_to_byte(p.cp) : -1;
            if (b >= 0)
              piece.push_back(static_cast<char>(b));
            else
              piece.append(tt, k, len);
            k += len;
          }
        }
        break;
      case kTypeByte:
        if (t->model_kind_ == ModelKind::kSpm && tt.size() >= 5)
          piece.push_back(static_cast<char>(std::strtol(tt.substr(3, 2).c_str(), nullptr, 16)));
        break;
      default:
        break;  // unused / undefined tokens print nothing
    }
    t->set_piece(static_cast<int32_t>(i), piece, -1);
  }

  t->finish_eos_ids();
  for (const auto& id : {eot, eom}) {
    if (id && std::find(t->eos_ids_.begin(), t->eos_ids_.end(), *id) == t->eos_ids_.end())
      t->eos_ids_.push_back(static_cast<int32_t>(*id));
  }

  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const std::string header = "gguf/" + model + "/" + pre + "/" + std::to_string(add_bos) + std::to_string(add_eos) +
                             std::to_string(t->spm_add_space_prefix_);
  XXH3_64bits_update(st, header.data(), header.size());
  for (const auto& tt : t->token_text_) XXH3_64bits_update(st, tt.data(), tt.size() + 1);
  XXH3_64bits_update(st, type.data(), type.size() * sizeof(int64_t));
  XXH3_64bits_update(st, score.data(), score.size() * sizeof(float));
  if (const GgufArray* merges = gguf.get_array("tokenizer.ggml.merges")) {
    for (const auto& m : *merges)
      if (const std::string* s = m.as_string()) XXH3_64bits_update(st, s->data(), s->size() + 1);
  }
  t->fingerprint_ = hex64(XXH3_64bits_digest(st));
  XXH3_freeState(st);

  RILL_TRY(t->validate(where));
  return t;
}

}  // namespace rill
