// Engine::load: model files + tokenizer + the registry's implementation,
// with the KV pool sized from the options.
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "engine/kv_calibration.h"
#include "loader/model_files.h"
#include "loader/mtp_layers.h"
#include "model/fingerprint.h"
#include "model/registry.h"
#include "rill/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

// The sidecar of artifact fingerprints in a disk tier's directory (the
// tier indexes only *.rkv files, so it leaves this one alone).
constexpr const char* kModelFingerprintSidecar = "model-fingerprints.json";

int64_t physical_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::load(const std::string& model_path, const EngineOptions& options) {
  RILL_ASSIGN_OR_RETURN(std::shared_ptr<ModelFiles> files, open_model_files(model_path));
  std::shared_ptr<const Tokenizer> tokenizer;
  if (files->gguf) {
    RILL_ASSIGN_OR_RETURN(auto t, Tokenizer::from_gguf(*files->gguf));
    tokenizer = std::move(t);
  } else if (!files->tokenizer_json_path.empty()) {
    RILL_ASSIGN_OR_RETURN(auto t, Tokenizer::from_tokenizer_json(files->tokenizer_json_path));
    tokenizer = std::move(t);
  }
  std::shared_ptr<const ChatTemplate> chat_template;
  if (!files->chat_template.empty()) {
    auto t = ChatTemplate::parse(files->chat_template);
    if (!t.ok()) return Error{files->path + ": " + t.error().message};
    chat_template = std::make_shared<const ChatTemplate>(std::move(t).value());
  }
  ModelOptions mo;
  mo.n_threads = options.n_threads;
  mo.n_ctx = options.n_ctx;
  mo.max_batch_tokens = std::max(1, options.max_batch_tokens);
  mo.max_batch_seqs = std::max(1, options.max_running);
  mo.n_state_slots = mo.max_batch_seqs;  // one live state / KV tail per running request
  // Speculation: a verify chunk returns a logit row per draft, so a step's
  // rows may exceed its sequences (the scheduler keeps within the model's).
  if (!options.spec.empty() && options.spec != "off") {
    mo.max_batch_seqs = std::min(mo.max_batch_tokens, mo.max_batch_seqs * (1 + std::max(1, options.spec_tokens)));
    mo.n_spec_states = std::max(1, options.spec_tokens);  // hybrids: rollback of the recurrent state
  }
  mo.kv_block_size = options.kv_block_size;
  if (options.kv_cache_mb > 0) {
    mo.kv_cache_bytes = options.kv_cache_mb << 20;
  } else if (options.kv_cache_fraction > 0) {
    if (options.kv_cache_fraction >= 1.0) return Error{"kv_cache_fraction must be below 1"};
    mo.kv_cache_bytes = static_cast<int64_t>(static_cast<double>(physical_ram_bytes()) * options.kv_cache_fraction);
  } else {
    mo.n_kv_slots = 4;
  }
  mo.device = options.device;
  mo.tensor_parallel = options.tensor_parallel;
  mo.batch_invariant = options.batch_invariant;
  mo.cuda_device_sampling = options.cuda_device_sampling;
  mo.quantize = options.quantize;
  mo.kv_types = options.kv_types;
  // q4a's calibration text, on either device (CUDA's model runs its own
  // pass: CudaModelBase::calibrate_kv).
  RILL_TRY(add_kv_calibration(tokenizer.get(), mo.kv_types));
  if (options.device == Device::kCuda && options.kv_cache_mb <= 0) {  // size KV from device memory, not RAM
    mo.kv_cache_bytes = 0;
    mo.gpu_memory_fraction = options.gpu_memory_fraction;
  }
  if (options.spec == "mtp") {  // the target's own MTP layer drafts (engine/mtp_speculator.h)
    auto mtp = find_mtp_layers(*files);
    if (!mtp.ok()) return Error{"--spec mtp: " + mtp.error().message};
    if (mtp->n_layers() == 0) {
      return Error{"--spec mtp: " + files->path +
                   " has no multi-token-prediction (MTP) layers (its config declares none: num_nextn_predict_layers, "
                   "mtp_num_hidden_layers or <arch>.nextn_predict_layers); use --spec ngram or draft=MODEL"};
    }
    mo.mtp = true;
  }
  const bool assistant = options.spec.rfind("assistant=", 0) == 0;
  if (assistant) {  // Gemma 4's assistant drafts, bound to the target (engine/assistant_speculator.h)
    mo.gemma4_assistant = options.spec.substr(10);
    if (mo.gemma4_assistant.empty()) return Error{"--spec assistant=PATH: the assistant checkpoint's path is empty"};
  }
  RILL_ASSIGN_OR_RETURN(auto model, create_model(builtin_registry(), infer_profile(*files), files, mo));
  // KV tails (k4c, k4a; model/kv_tails.h) run with drafts: the engine ends
  // each request's drafts before its KV block does
  // (EngineImpl::draft_length), so a rejection never falls in a block
  // already encoded. The MTP layer's own KV plane, whose chained drafts
  // write past the verified rows, keeps the model's own KV type on the CPU
  // (CpuPagedModel::kv_draft_planes_); CUDA stores a pair in every layer.
  if (model->n_kv_tail_slots() > 0 && options.spec == "mtp" && options.device == Device::kCuda) {
    return Error{
        "--spec mtp: KV types q4c / q4a (k4c, k4a) do not run with the model's MTP layer on CUDA (CUDA stores "
        "the pair in every layer, the MTP layer's too, whose drafts rewrite rows a pair encodes once); use "
        "--device cpu, --spec ngram or draft=MODEL, or another KV type"};
  }
  if (assistant && model->n_mtp_layers() == 0) {  // a family that does not run one left it unbound
    return Error{"--spec " + options.spec + ": " + files->path + " (" + files->config.architecture +
                 ") does not run a Gemma 4 assistant (a Gemma 4 target does, on the CPU or CUDA)"};
  }
  EngineOptions eo = options;
  eo.model_path = model_path;
  // The artifact fingerprint keys only the disk tier's files, and reads
  // every weight byte: computed only for a disk tier, and remembered in its
  // directory's sidecar so a restart on unchanged files does not rehash
  // (model/fingerprint.h; the cost is in docs/limits.md).
  if (eo.model_id.empty() && !eo.cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(eo.cache_dir, ec);  // DiskTier::open reports a bad directory
    eo.model_id =
        artifact_fingerprint_cached(*files, (std::filesystem::path(eo.cache_dir) / kModelFingerprintSidecar).string());
  }
  return create(std::move(model), std::move(tokenizer), eo, std::move(chat_template));
}

}  // namespace rill
