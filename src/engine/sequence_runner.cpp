#include "engine/sequence_runner.h"

#include <algorithm>
#include <limits>
#include <string>

namespace rill {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

SequenceRunner::SequenceRunner(Model& model, int32_t kv_slot)
    : model_(model), slot_(kv_slot), table_(slot_block_table(kv_slot, model.n_ctx(), model.kv_block_size())) {
  logits_.resize(static_cast<size_t>(model_.n_vocab()));
  batch_.group_tables.resize(std::max<size_t>(model_.kv_spec().size(), 1) - 1);
}

void SequenceRunner::set_chunk(const int32_t* ids, int32_t n, int32_t pos0, bool sample_last) {
  batch_.clear();
  batch_.add_sequence(ids, n, pos0, sample_last, table_);
  batch_.seqs.back().state_slot = slot_;  // read only by models with recurrent layers
  batch_.seqs.back().kv_tail = model_.n_kv_tail_slots() > 0 ? slot_ : -1;
  batch_.seqs.back().decode_from = decode_from_;
  for (auto& t : batch_.group_tables) t.insert(t.end(), table_.begin(), table_.end());
}

Status SequenceRunner::prefill(std::span<const int32_t> ids, size_t from, bool want_all_rows) {
  const size_t chunk = static_cast<size_t>(model_.max_batch_tokens());
  const auto V = static_cast<size_t>(model_.n_vocab());
  cached_.resize(from);
  for (size_t begin = from; begin < ids.size(); begin += chunk) {
    const size_t end = std::min(ids.size(), begin + chunk);
    const bool last_chunk = end == ids.size();
    set_chunk(ids.data() + begin, static_cast<int32_t>(end - begin), static_cast<int32_t>(begin),
              last_chunk && !want_all_rows);
    float* out = logits_.data();
    if (want_all_rows) {
      batch_.sample_rows.clear();
      for (int32_t i = 0; i < batch_.n_tokens(); ++i) batch_.sample_rows.push_back(i);
      out = logits_.data() + begin * V;
    }
    Status st = model_.forward(batch_, out);
    if (!st.ok()) {
      cached_.clear();  // the slot's contents are unknown after a failed step
      return st;
    }
    cached_.insert(cached_.end(), ids.begin() + static_cast<ptrdiff_t>(begin),
                   ids.begin() + static_cast<ptrdiff_t>(end));
  }
  return {};
}

Result<GenerationResult> SequenceRunner::generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                                                  const std::function<bool(int32_t)>& on_token) {
  if (model_.embedding().bidirectional)
    return Error{
        "this is an encoder (embedding) model: it computes no logits; serve it (rill serve) and POST /v1/embeddings"};
  if (prompt.empty()) return Error{"the prompt is empty"};
  const int64_t needed = static_cast<int64_t>(prompt.size()) + std::max(0, options.max_tokens);
  if (needed > model_.n_ctx()) {
    return Error{"prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                 std::to_string(options.max_tokens) + ") exceeds the context of " + std::to_string(model_.n_ctx()) +
                 " tokens"};
  }
  const auto t0 = Clock::now();
  GenerationResult result;
  result.timings.n_prompt = static_cast<int>(prompt.size());

  // Longest cached prefix, leaving at least one token to compute.
  size_t reuse = 0;
  while (reuse < cached_.size() && reuse + 1 < prompt.size() && cached_[reuse] == prompt[reuse]) ++reuse;
  // A recurrent state only moves forward: it continues the whole cached
  // sequence or starts again from position 0.
  const auto& spec = model_.kv_spec();
  const bool recurrent =
      std::any_of(spec.begin(), spec.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
  if (recurrent && reuse < cached_.size()) reuse = 0;
  // A KV tail (k4c) holds the keys of the cached sequence's last partial
  // block only: going back into an earlier block resumes at its start.
  const auto bs = static_cast<size_t>(model_.kv_block_size());
  if (model_.n_kv_tail_slots() > 0 && reuse < cached_.size() && reuse / bs != cached_.size() / bs) {
    reuse -= reuse % bs;
  }
  result.timings.n_cached = static_cast<int>(reuse);
  logits_.resize(static_cast<size_t>(model_.n_vocab()));
  decode_from_ = static_cast<int32_t>(prompt.size());
  RILL_TRY(prefill(prompt, reuse, /*want_all_rows=*/false));
  result.timings.prefill_s = seconds_since(t0);

  Sampler sampler(options.sampling, model_.n_vocab());
  sampler.add_prompt_tokens(prompt);
  const auto t_decode = Clock::now();
  for (int n = 0; n < options.max_tokens; ++n) {
    if (n > 0) {
      const int32_t last = result.ids.back();
      set_chunk(&last, 1, static_cast<int32_t>(cached_.size()), true);
      Status st = model_.forward(batch_, logits_.data());
      if (!st.ok()) {
        cached_.clear();
        return st.error();
      }
      cached_.push_back(last);
    }
    const int32_t id = sampler.sample(logits_.data());
    sampler.add_output_token(id);
    result.ids.push_back(id);
    if (n == 0) result.timings.first_token_s = seconds_since(t0);
    if (!on_token(id)) {
      result.finish = FinishReason::kAborted;
      break;
    }
    if (!options.ignore_eos && std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end()) {
      result.finish = FinishReason::kStop;
      break;
    }
  }
  result.timings.n_generated = static_cast<int>(result.ids.size());
  result.timings.decode_s = seconds_since(t_decode);
  return result;
}

Result<std::vector<float>> SequenceRunner::score(std::span<const int32_t> ids) {
  if (model_.embedding().bidirectional)
    return Error{
        "this is an encoder (embedding) model: it computes no logits; serve it (rill serve) and POST /v1/embeddings"};
  if (ids.empty()) return Error{"no token ids to score"};
  if (static_cast<int64_t>(ids.size()) > model_.n_ctx()) {
    return Error{std::to_string(ids.size()) + " ids exceed the context of " + std::to_string(model_.n_ctx()) +
                 " tokens"};
  }
  logits_.assign(ids.size() * static_cast<size_t>(model_.n_vocab()), 0.0f);
  decode_from_ = std::numeric_limits<int32_t>::max();  // every id is prompt
  RILL_TRY(prefill(ids, 0, /*want_all_rows=*/true));
  std::vector<float> out = std::move(logits_);
  logits_.assign(static_cast<size_t>(model_.n_vocab()), 0.0f);
  return out;
}

}  // namespace rill
