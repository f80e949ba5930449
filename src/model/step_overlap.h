#pragma once
// StepOverlap: a capability of models whose steps run on a device queue
// (the CUDA runtime, model/cuda_model_base.h): a greedy or sampled step is
// queued without waiting for it, and the next step may be queued behind it
// with its input tokens taken, on the device, from the ids the queued step
// draws. The engine's pipelined decode (docs/architecture.md) plans and
// queues step n + 1 while the device computes step n, then reads step n's
// ids. Kept out of Model: only a runtime with a device queue offers it, and
// callers find it once (dynamic_cast at construction), not per step.
//
// Protocol (one thread, the engine's): launch_ids() queues a step; at most
// two steps are queued; take_ids() completes the oldest. Model's forward
// calls may only be made with no step queued.
#include <cstdint>

#include "backend/sampling.h"
#include "core/result.h"
#include "model/batch.h"

namespace rill {

class StepOverlap {
 public:
  virtual ~StepOverlap() = default;

  // Whether launch_ids() may be used for this model at all (a runtime may
  // refuse for configurations it does not pipeline: recurrent state,
  // tensor-parallel shards, KV tails).
  virtual bool can_queue_steps() const = 0;

  // Queues forward_greedy (rows == nullptr) or forward_sample (rows[i]
  // for sample row i) of `batch`, without token masks, and returns without
  // waiting. The batch and rows are copied before it returns.
  // chain_ids: every sequence of the batch is one token, the batch has as
  // many tokens as the step queued just before it (still queued) has
  // sample rows, and token i's id is replaced on the device by the id that
  // step draws for its sample row i (batch.token_ids then holds
  // placeholders in the vocabulary). Errors leave nothing queued by this
  // call.
  virtual Status launch_ids(const Batch& batch, const DeviceSamplingParams* rows, bool chain_ids) = 0;

  // Waits for the oldest queued step and writes its ids (one per sample
  // row of its batch) to `ids`; a step that failed on the device returns
  // its error here.
  virtual Status take_ids(int32_t* ids) = 0;

  // Steps queued and not yet taken (0, 1 or 2).
  virtual int n_queued() const = 0;
};

}  // namespace rill
