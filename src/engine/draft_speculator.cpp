#include "engine/draft_speculator.h"

#include <algorithm>
#include <cassert>

#include "loader/model_files.h"
#include "model/registry.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFiles& files) {
  if (files.gguf) return Tokenizer::from_gguf(*files.gguf);
  if (!files.tokenizer_json_path.empty()) return Tokenizer::from_tokenizer_json(files.tokenizer_json_path);
  return std::unique_ptr<Tokenizer>();
}

}  // namespace

Result<std::unique_ptr<Speculator>> DraftModelSpeculator::load(const std::string& path,
                                                               const SpeculatorTarget& target) {
  assert(target.model);
  const std::string where = "--spec draft=" + path;
  auto files = open_model_files(path);
  if (!files.ok()) return Error{where + ": " + files.error().message};
  auto tok = load_tokenizer(**files);
  if (!tok.ok()) return Error{where + ": " + tok.error().message};
  const std::string target_name = target.model_path.empty() ? std::string("the target model") : target.model_path;
  if (target.tokenizer && *tok) {
    if ((*tok)->fingerprint() != target.tokenizer->fingerprint()) {
      return Error{where + ": the draft model's tokenizer (" + std::to_string((*tok)->n_vocab()) + " tokens, " + path +
                   ") differs from the target's (" + std::to_string(target.tokenizer->n_vocab()) + " tokens, " +
                   target_name + "); a draft model must share the target's tokenizer"};
    }
  }
  ModelOptions mo;
  mo.device = target.options.device;
  mo.n_threads = target.options.n_threads;
  mo.n_ctx = target.model->n_ctx();
  mo.max_batch_tokens = std::max(1, target.options.max_batch_tokens);
  mo.max_batch_seqs = 1;  // one request at a time
  mo.kv_block_size = target.options.kv_block_size;
  mo.batch_invariant = target.options.batch_invariant;
  mo.quantize = target.options.quantize;
  if (target.options.kv_cache_mb > 0) {
    mo.kv_cache_bytes = target.options.kv_cache_mb << 20;
  } else {
    mo.n_kv_slots = 4;
  }
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  if (!model.ok()) return Error{where + ": " + model.error().message};
  const KvSpec& spec = (*model)->kv_spec();
  if (std::any_of(spec.begin(), spec.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); })) {
    return Error{where + ": a draft model with recurrent layers is not supported (its state is not rolled back)"};
  }
  if (!(target.tokenizer && *tok) && (*model)->n_vocab() != target.model->n_vocab()) {
    return Error{where + ": the draft model's vocabulary (" + std::to_string((*model)->n_vocab()) + " tokens, " + path +
                 ") differs from the target's (" + std::to_string(target.model->n_vocab()) + " tokens, " + target_name +
                 ")"};
  }
  return std::unique_ptr<Speculator>(new DraftModelSpeculator(std::move(model).value(), target.model->n_vocab()));
}

DraftModelSpeculator::DraftModelSpeculator(std::unique_ptr<Model> model, int64_t n_target_vocab)
    : model_(std::move(model)),
      n_target_vocab_(n_target_vocab),
      pool_(model_->n_kv_blocks(), model_->kv_block_size()),
      tree_(pool_),
      states_(0, 0),
      kv_(model_->kv_spec(), pool_, tree_, states_) {
  const size_t n_groups = model_->kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
  if (!model_->has_forward_greedy()) logits_.resize(static_cast<size_t>(model_->n_vocab()));
}

void DraftModelSpeculator::release(uint64_t seq) {
  kv_.release(static_cast<int64_t>(seq));
  seqs_.erase(seq);
}

bool DraftModelSpeculator::grow(uint64_t seq, int32_t n) {
  const auto id = static_cast<int64_t>(seq);
  if (!kv_.can_allocate(id, n)) {
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      if (it->first == seq) {
        ++it;
        continue;
      }
      kv_.release(static_cast<int64_t>(it->first));
      it = seqs_.erase(it);
    }
    if (!kv_.can_allocate(id, n)) return false;
  }
  return kv_.append(id, n).ok();
}

int32_t DraftModelSpeculator::run(uint64_t seq, const int32_t* ids, int32_t n, int32_t pos, int32_t decode_from) {
  const auto id = static_cast<int64_t>(seq);
  batch_.clear();
  const int32_t s = batch_.add_sequence(ids, n, pos, true, {});
  BatchSeq& bs = batch_.seqs[static_cast<size_t>(s)];
  bs.decode_from = decode_from;  // a token's draft does not depend on how it was chunked
  bs.table_len = kv_.append_block_table(id, 0, batch_.block_table);
  for (size_t g = 1; g <= batch_.group_tables.size(); ++g)
    kv_.append_block_table(id, static_cast<int32_t>(g), batch_.group_tables[g - 1]);
  int32_t next = -1;
  if (model_->has_forward_greedy()) {
    if (!model_->forward_greedy(batch_, TokenMasks{}, &next).ok()) return -1;
    return next;
  }
  if (!model_->forward(batch_, logits_.data()).ok()) return -1;
  return static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
}

void DraftModelSpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                                   std::vector<int32_t>& out) {
  assert(max_tokens >= 1 && !tokens.empty());
  const auto id = static_cast<int64_t>(seq);
  if (static_cast<int64_t>(tokens.size()) + max_tokens > model_->n_ctx()) return;
  if (!kv_.contains(id)) {
    if (!kv_.admit(id, 0, tokens).ok()) return;
    // Its first propose follows the request's first output token (the
    // owed one): the output starts there, computed in the decode form as
    // the target computes it.
    seqs_[seq] = Sequence{{}, static_cast<int32_t>(tokens.size()) - 1};
  }
  Sequence& sq = seqs_[seq];
  std::vector<int32_t>& computed = sq.computed;
  // Roll back to what the draft's KV shares with the request (the target
  // rejected the rest), keeping one token to compute for the next logits.
  const auto common = static_cast<int32_t>(std::min<size_t>(
      std::mismatch(computed.begin(), computed.end(), tokens.begin(), tokens.end()).first - computed.begin(),
      tokens.size() - 1));
  if (!kv_.truncate(id, common).ok()) {
    release(seq);
    return;
  }
  computed.resize(static_cast<size_t>(common));
  int32_t next = -1;
  while (computed.size() < tokens.size()) {
    const auto pos = static_cast<int32_t>(computed.size());
    const int32_t n = std::min(static_cast<int32_t>(tokens.size()) - pos, model_->max_batch_tokens());
    if (!grow(seq, n) || (next = run(seq, tokens.data() + pos, n, pos, sq.decode_from)) < 0) {
      release(seq);
      return;
    }
    computed.insert(computed.end(), tokens.begin() + pos, tokens.begin() + pos + n);
  }
  for (int32_t i = 0; i < max_tokens && next >= 0 && next < n_target_vocab_; ++i) {
    out.push_back(next);
    if (i + 1 == max_tokens) break;
    const auto pos = static_cast<int32_t>(computed.size());
    if (!grow(seq, 1)) break;
    const int32_t drafted = next;
    next = run(seq, &drafted, 1, pos, sq.decode_from);
    if (next < 0) {
      release(seq);
      return;
    }
    computed.push_back(drafted);
  }
}

}  // namespace rill
