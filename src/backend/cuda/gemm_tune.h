#pragma once
// Timing of candidate GEMM algorithms for Gemm's per-shape choice (gemm.h).
#include <functional>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "core/result.h"

namespace rill::cuda {

// Times launch(i) for each candidate i in [0, count) on ctx's stream, in
// stream order after the work already queued there: one untimed warm-up
// round, then `reps` timed runs of each, every run after a memset of
// `flush` (flush_bytes, >= twice the L2: the weights come from memory, as
// in a model step that streams them; may be null, then L2 stays warm).
// reps is 3, or 1 when the first candidate's warm-up took over 2 ms (long
// prefill shapes). launch returns false when the candidate cannot run; it
// is skipped. Returns each candidate's median time in ms (a negative value:
// skipped). Must not be called while the stream is being captured.
Result<std::vector<float>> time_candidates(const Context& ctx, int count, const std::function<bool(int)>& launch,
                                           void* flush, size_t flush_bytes);

// Index of the fastest timed candidate (the earliest on ties), -1 when none ran.
int fastest(const std::vector<float>& ms);

}  // namespace rill::cuda
