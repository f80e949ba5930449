#include "engine/speculator.h"

#include <algorithm>
#include <cassert>

#include "engine/assistant_speculator.h"
#include "engine/draft_speculator.h"
#include "engine/mtp_speculator.h"
#include "engine/replay_speculator.h"

namespace rill {

void Speculator::propose_batch(std::span<DraftRequest> requests, std::vector<int32_t>& out) {
  for (DraftRequest& r : requests) {
    const size_t before = out.size();
    propose(r.seq, r.tokens, r.max_tokens, out);
    r.n_drafts = static_cast<int32_t>(out.size() - before);
  }
}

NgramSpeculator::NgramSpeculator(int32_t max_ngram, int32_t min_ngram)
    : max_ngram_(std::max(1, max_ngram)), min_ngram_(std::clamp(min_ngram, 1, std::max(1, max_ngram))) {}

void NgramSpeculator::propose(uint64_t /*seq*/, std::span<const int32_t> tokens, int32_t max_tokens,
                              std::vector<int32_t>& out) {
  assert(max_tokens >= 1);
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  for (int32_t n = max_ngram_; n >= min_ngram_; --n) {
    if (n_tokens < n + 1) continue;
    const std::span<const int32_t> tail = tokens.last(static_cast<size_t>(n));
    // The latest occurrence first: it is the likeliest to continue the same
    // way (a passage being rewritten is copied in order). The tail itself
    // (start n_tokens - n) is not an earlier occurrence.
    for (int64_t start = n_tokens - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t end = std::min(n_tokens, from + max_tokens);
      out.insert(out.end(), tokens.begin() + from, tokens.begin() + end);
      return;
    }
  }
}

namespace {

// `--spec mtp`: the target's MTP layer, which Engine::load binds
// (ModelOptions::mtp) after refusing files without one.
Result<std::unique_ptr<Speculator>> make_mtp_speculator(const SpeculatorTarget& target) {
  if (!target.model) return Error{"--spec mtp: needs the target model"};
  if (target.model->n_mtp_layers() == 0) {
    const std::string name = target.model_path.empty() ? std::string("the model") : target.model_path;
    return Error{"--spec mtp: " + name +
                 " was loaded without its multi-token-prediction layer (ModelOptions::mtp, which Engine::load sets)"};
  }
  if (const std::string src = target.model->mtp_head_source(); !src.empty()) {
    return Error{"--spec mtp: the model's draft head is the Gemma 4 assistant " + src +
                 " (use --spec assistant=" + src + ")"};
  }
  return std::unique_ptr<Speculator>(std::make_unique<MtpSpeculator>(*target.model));
}

// `--spec assistant=PATH`: Gemma 4's assistant, which Engine::load binds
// to the target (ModelOptions::gemma4_assistant).
Result<std::unique_ptr<Speculator>> make_assistant_speculator(const std::string& spec, const SpeculatorTarget& target) {
  if (spec.size() == 10) return Error{"--spec assistant=PATH: the assistant checkpoint's path is empty"};
  if (!target.model) return Error{"--spec " + spec + ": needs the target model"};
  if (target.model->n_mtp_layers() == 0) {
    const std::string name = target.model_path.empty() ? std::string("the model") : target.model_path;
    return Error{"--spec " + spec + ": " + name +
                 " was loaded without the assistant (ModelOptions::gemma4_assistant, which Engine::load sets)"};
  }
  if (const std::string src = target.model->mtp_head_source(); src != spec.substr(10)) {
    return Error{"--spec " + spec + ": the model's draft head is " +
                 (src.empty() ? std::string("its own MTP layer (use --spec mtp)") : "the assistant " + src)};
  }
  return std::unique_ptr<Speculator>(std::make_unique<AssistantSpeculator>(*target.model));
}

}  // namespace

Result<std::unique_ptr<Speculator>> make_speculator(const std::string& spec, const SpeculatorTarget& target) {
  if (spec.empty() || spec == "off") return std::unique_ptr<Speculator>();
  if (spec == "ngram") return std::unique_ptr<Speculator>(std::make_unique<NgramSpeculator>());
  if (spec.rfind("replay=", 0) == 0) return make_replay_speculator(spec.substr(7));
  if (spec.rfind("draft=", 0) == 0) {
    const std::string path = spec.substr(6);
    if (path.empty()) return Error{"--spec draft=PATH: the draft model's path is empty"};
    if (!target.model) return Error{"--spec " + spec + ": a draft model needs the target model"};
    return DraftModelSpeculator::load(path, target);
  }
  if (spec == "mtp") return make_mtp_speculator(target);
  if (spec.rfind("assistant=", 0) == 0) return make_assistant_speculator(spec, target);
  return Error{"--spec: unknown speculator '" + spec +
               "' (expected ngram, off, draft=MODEL, mtp, assistant=PATH or replay=FILE)"};
}

}  // namespace rill
