#pragma once
// The interactive terminal chat of `rill run` and the prompt helpers it
// shares with the one-shot path.
#include <string>
#include <vector>

#include "cli/loaded_model.h"
#include "cli/run_options.h"

namespace rill::cli {

// Renders one user turn (plus an optional system message) with the model's
// chat template, or takes the text as it is when `raw` or when the model has
// no template; then tokenizes.
Result<std::vector<int32_t>> encode_prompt(const LoadedModel& m, const std::string& user, const std::string& system,
                                           bool raw);

// The ids that end a turn: the config's eos ids plus the tokenizer's.
std::vector<int32_t> eos_ids(const LoadedModel& m);

// Reads lines from stdin and streams replies until EOF or /exit.
int run_chat(const RunOptions& options);

}  // namespace rill::cli
