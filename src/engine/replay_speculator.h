#pragma once
// ReplaySpeculator: a benchmark instrument, not a guesser. It proposes the
// continuation a request produced in an earlier run (recorded with
// `rill bench --record-tokens FILE`), so with greedy decoding every draft
// holds (acceptance 1) and a run measures what the verification mechanism
// itself gains: the tokens per step a perfect draft would buy, the cost of a
// k + 1 token verify step against a one-token decode step. With
// `replay=FILE:A` each proposed token is replaced by a wrong one with
// probability 1 - A (decided by a hash of the request and position, so runs
// repeat), which traces the acceptance-to-speedup curve a real draft would
// sit on. Random-weight models accept nothing from a real speculator; this
// is how their speculative path is measured.
//
// File: JSON {"sequences": [[token ids: prompt then output], ...]}. A
// request is matched by its whole token list being a prefix of a recorded
// sequence; a request without a match gets no drafts.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/speculator.h"

namespace rill {

class ReplaySpeculator final : public Speculator {
 public:
  // acceptance in [0, 1]: the chance each proposed token is the recorded one.
  ReplaySpeculator(std::vector<std::vector<int32_t>> sequences, double acceptance);
  const char* name() const override { return "replay"; }
  void propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& out) override;

 private:
  // The recorded sequence `tokens` is a prefix of, or null.
  const std::vector<int32_t>* match(std::span<const int32_t> tokens) const;

  std::vector<std::vector<int32_t>> sequences_;
  uint64_t keep_threshold_;  // a draft is kept when its position hash is below this
};

// "FILE" or "FILE:A" (the part after `replay=`): reads the recorded
// sequences; an unreadable or malformed file is an error naming it.
Result<std::unique_ptr<Speculator>> make_replay_speculator(const std::string& arg);

// Writes `sequences` in the format make_replay_speculator reads.
Status write_replay_file(const std::string& path, const std::vector<std::vector<int32_t>>& sequences);

}  // namespace rill
