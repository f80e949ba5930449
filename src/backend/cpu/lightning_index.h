#pragma once
// DeepSeek sparse attention's lightning indexer on the CPU (backend.h's
// lightning_index()): the keys stored into the latent rows, then per query
// token the scores over its stored keys and the top-k selection.
#include "backend/backend.h"
#include "core/thread_pool.h"

namespace rill::cpu {

// backend.h's lightning_index(); `rope` is op.rope's table. Keys are stored
// for every token of the step before any token scores (a token reads the
// keys of the tokens before it in its step), then tokens score in parallel,
// each alone: a token's selection does not depend on its step.
void lightning_index(const LightningIndexOp& op, const RopeTable& rope, const StepMetadata& step, ThreadPool& pool);

}  // namespace rill::cpu
