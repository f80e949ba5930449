#include "model/cpu_paged_model.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <climits>
#include <cstdio>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "core/e4m3.h"
#include "core/hash.h"

namespace rill {

void CpuPagedModel::set_limits(const ModelOptions& options) {
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : cfg_.max_position;
  if (n_ctx_ <= 0) n_ctx_ = 4096;
  max_tokens_ = std::max(1, options.max_batch_tokens);
  max_seqs_ = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens_) : max_tokens_;
}

Status CpuPagedModel::create_kv(const ModelOptions& options, int64_t n_layers, int64_t kv_width, int64_t head_dim,
                                DType dtype) {
  if (head_dim <= 0 || kv_width % head_dim != 0) {
    return Error{files_->path + ": a KV row of " + std::to_string(kv_width) + " is not whole heads of " +
                 std::to_string(head_dim)};
  }
  const PagedKvCache::LayerSpec plane{kv_width / head_dim, head_dim, {}};
  return create_kv(
      options, std::vector<PagedKvCache::LayerSpec>(static_cast<size_t>(std::max<int64_t>(n_layers, 0)), plane), dtype);
}

Status CpuPagedModel::create_kv(const ModelOptions& options, std::vector<PagedKvCache::LayerSpec> planes, DType dtype) {
  if (planes.empty()) return Error{files_->path + ": the model has no KV layers"};
  RILL_ASSIGN_OR_RETURN(std::vector<KvLayerTypes> types,
                        options.kv_types.resolve(static_cast<int64_t>(planes.size()), dtype));
  for (size_t l = planes.size() - static_cast<size_t>(std::min<int64_t>(kv_draft_planes_, std::ssize(planes)));
       l < planes.size(); ++l) {
    if (kv_chan_k(types[l].k.dtype)) types[l] = KvLayerTypes{KvType{dtype, false}, KvType{dtype, false}};
  }
  size_t token_bytes = 0;
  std::vector<int64_t> tail_widths;
  for (size_t l = 0; l < planes.size(); ++l) {
    PagedKvCache::LayerSpec& p = planes[l];
    p.types = types[l];
    if (Status st = check_kv_layer_types(static_cast<int64_t>(l), p.types, p.n_head_kv, p.head_dim); !st.ok())
      return Error{files_->path + ": " + st.error().message};
    const int64_t width = p.n_head_kv * p.head_dim;
    token_bytes += row_bytes(p.types.k.dtype, width) + row_bytes(p.types.v.dtype, width);
    tail_widths.push_back(kv_chan_k(p.types.k.dtype) ? width : 0);
    // attention_chan keeps one key's probabilities for a KV head's query
    // heads in a fixed array of 64 (backend/cpu/attention_chan_impl.h);
    // a plane's KV heads are its own (Gemma 4's full layers have fewer).
    if (kv_chan_k(p.types.k.dtype) && p.n_head_kv > 0 && cfg_.n_head / p.n_head_kv > 64) {
      return Error{files_->path + ": KV types q4c / q4a (k4c, k4a) read at most 64 query heads per KV head, not " +
                   std::to_string(cfg_.n_head / p.n_head_kv) + " (KV layer " + std::to_string(l) + ")"};
    }
  }
  const size_t tail_bytes = KvTails::slot_bytes(tail_widths);
  if (tail_bytes > 0 && !kv_tails_supported_) {
    return Error{files_->path +
                 ": KV types q4c / q4a (k4c, k4a) need a per-sequence KV tail, which only the Llama and Gemma " +
                 "families' CPU models keep; use another KV type"};
  }
  // Pools holding q4c have blocks of its group (kv_types.h).
  const int32_t bs = tail_bytes > 0 ? cpu::kKvChanTokens : options.kv_block_size;
  if (bs <= 0 || !std::has_single_bit(static_cast<uint32_t>(bs))) {
    return Error{files_->path + ": KV block size " + std::to_string(bs) + " is not a power of two"};
  }
  // Tail slots: one per sequence that runs at once: the engine's requests
  // (n_state_slots, which it sets to --max-running; max_batch_seqs grows
  // with --spec to a logit row per draft), else n_kv_slots (a model driven
  // directly: rill run / score, benches), not max_batch_tokens.
  const int32_t live = options.n_state_slots > 0 ? options.n_state_slots : options.max_batch_seqs > 0 ? max_seqs_ : 1;
  const int32_t n_tail_slots = tail_bytes > 0 ? std::max(live, std::max(1, options.n_kv_slots)) : 0;
  kv_types_desc_ = describe_kv_types(types, dtype);
  // A KV budget covers the tails too (their real bytes), the rest holds blocks.
  const int64_t budget = options.kv_cache_bytes - static_cast<int64_t>(tail_bytes) * n_tail_slots;
  const int64_t n_blocks = options.kv_cache_bytes > 0 ? std::max<int64_t>(0, budget) /
                                                            static_cast<int64_t>(token_bytes * static_cast<size_t>(bs))
                                                      : std::max(1, options.n_kv_slots) * ((n_ctx_ + bs - 1) / bs);
  if (n_blocks < 1 || n_blocks > INT32_MAX) {
    return Error{
        files_->path + ": a KV cache of " + std::to_string(options.kv_cache_bytes) + " bytes holds no whole block of " +
        std::to_string(bs) + " tokens (" + std::to_string(token_bytes) + " bytes per token" +
        (tail_bytes > 0
             ? ", after " + std::to_string(n_tail_slots) + " KV tails of " + std::to_string(tail_bytes) + " bytes"
             : std::string()) +
        ")"};
  }
  RILL_ASSIGN_OR_RETURN(kv_, PagedKvCache::create_layers(std::move(planes), static_cast<int32_t>(n_blocks), bs));
  return kv_.create_tails(n_tail_slots);
}

Status CpuPagedModel::check_kv_block(int64_t layer, int32_t block) const {
  if (layer < 0 || layer >= kv_.n_layers() || block < 0 || block >= kv_.n_blocks()) {
    return Error{"KV layer " + std::to_string(layer) + " block " + std::to_string(block) + " does not exist"};
  }
  return {};
}

Status CpuPagedModel::copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  RILL_TRY(check_kv_block(layer, block));
  kv_.copy_block_out(layer, block, k, v);
  return {};
}

Status CpuPagedModel::copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) {
  RILL_TRY(check_kv_block(layer, block));
  kv_.copy_block_in(layer, block, k, v);
  return {};
}

void CpuStepArrays::reserve(int64_t max_tokens) {
  const auto T = static_cast<size_t>(max_tokens);
  for (std::vector<int32_t>* v : {&q_start, &q_len, &kv_len, &decode_from, &table_start, &kv_tail}) v->reserve(T);
  for (std::vector<int32_t>& v : slots) v.reserve(T);
  rec_seqs.resize(T);
  rec_saves.resize(T);  // at most one save per token
  rec_tok_seq.resize(T);
}

Status CpuPagedModel::create_states(Backend& device, int64_t n_layers, std::vector<StateTensor> tensors,
                                    const ModelOptions& options) {
  RILL_ASSIGN_OR_RETURN(states_, StatePool::create(device, n_layers, std::move(tensors), max_seqs_, options));
  states_device_ = &device;
  return Status::Ok();
}

Status CpuPagedModel::copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const {
  if (!states_) return Model::copy_state_out(checkpoint, layer, out);
  return states_->copy_out(*states_device_, checkpoint, layer, out);
}

Status CpuPagedModel::copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) {
  if (!states_) return Model::copy_state_in(checkpoint, layer, in);
  return states_->copy_in(*states_device_, checkpoint, layer, in);
}

StepMetadata CpuPagedModel::step_metadata(const Batch& batch, CpuStepArrays& a) const {
  for (std::vector<int32_t>* v : {&a.q_start, &a.q_len, &a.kv_len, &a.decode_from, &a.table_start, &a.kv_tail}) {
    v->clear();
  }
  for (const BatchSeq& s : batch.seqs) {
    a.kv_tail.push_back(s.kv_tail);
    a.q_start.push_back(s.q_start);
    a.q_len.push_back(s.q_len);
    a.kv_len.push_back(s.kv_len);
    a.decode_from.push_back(s.decode_from);
    a.table_start.push_back(s.table_start);
  }
  StepMetadata md;
  md.n_tokens = batch.n_tokens();
  md.n_seqs = static_cast<int32_t>(batch.seqs.size());
  md.n_sample = static_cast<int32_t>(batch.sample_rows.size());
  md.ids = batch.token_ids.data();
  md.pos = batch.positions.data();
  md.seq_of = batch.seq_index.data();
  md.sample_rows = batch.sample_rows.data();
  md.q_start = a.q_start.data();
  md.q_len = a.q_len.data();
  md.kv_len = a.kv_len.data();
  md.decode_from = a.decode_from.data();
  md.table_start = a.table_start.data();
  md.kv_tail = kv_.tails().empty() ? nullptr : a.kv_tail.data();
  // Slot of each token in each attention group: its position's block in
  // the group's table (inside any window: check_batch saw to it).
  const int32_t shift = kv_.layer_view(0).block_shift, mask = kv_.block_size() - 1;
  for (int32_t g = 0; g < kMaxKvGroups && g < static_cast<int32_t>(kv_spec_.size()); ++g) {
    if (!kv_spec_[static_cast<size_t>(g)].is_attention()) continue;
    std::vector<int32_t>& slots = a.slots[g];
    slots.resize(static_cast<size_t>(batch.n_tokens()));
    for (const BatchSeq& s : batch.seqs) {
      const int32_t* table = batch.table(g, s).data();
      for (int32_t t = s.q_start; t < s.q_start + s.q_len; ++t) {
        const int32_t p = batch.positions[static_cast<size_t>(t)];
        slots[static_cast<size_t>(t)] = (table[p >> shift] << shift) + (p & mask);
      }
    }
    md.slots[g] = slots.data();
    md.block_tables[g] = g == 0 ? batch.block_table.data() : batch.group_tables[static_cast<size_t>(g - 1)].data();
  }
  if (states_) {
    md.recurrent = states_->plan(batch, batch.n_tokens(), a.rec_seqs.data(), a.rec_saves.data(), a.rec_tok_seq.data());
  }
  return md;
}

std::string CpuPagedModel::kv_numerics() const {
  // r2: Q4_K/Q5_K/Q6_K dots as exact int32s per super-block (quants_ref.cpp);
  // r3: IQ4_XS's too; r4: AVX2's f16 attention through tiles with a vector
  // softmax (2a2a64a: other bits on AVX2, and so other K/V in later layers).
  // KV computed by earlier builds' arithmetic is refused.
  std::string s = std::string("cpu ") + cpu::isa_name(cpu::best_isa()) + " r4";
  if (!kv_types_desc_.empty()) s += " " + kv_types_desc_;
  // q4a's blocks mean nothing under other widths: their hash (XXH3 of every
  // q4a layer's index and widths in order) joins the numerics, so a tier
  // entry or KV file made under other widths is refused.
  std::vector<uint8_t> all;
  for (int64_t l = 0; l < kv_.n_layers(); ++l) {
    const std::vector<uint8_t>& w = kv_.k_widths(l);
    if (w.empty()) continue;
    for (int i = 0; i < 4; ++i) all.push_back(static_cast<uint8_t>(l >> (8 * i)));
    all.insert(all.end(), w.begin(), w.end());
  }
  if (!all.empty()) s += " q4a-widths=" + hex64(hash64(all.data(), all.size()));
  return s;
}

Result<int64_t> CpuPagedModel::kv_calibration_length(const std::string& path, size_t n_text, int64_t n_ctx,
                                                     int64_t pool_tokens, int64_t block_size) {
  const int64_t bs = block_size;
  const int64_t room = std::min<int64_t>({kKvCalibrationTokens, n_ctx, pool_tokens});
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(n_text), room);
  if (n < 2 * bs) {
    return Error{path + ": KV type q4a calibrates its widths on at least " + std::to_string(2 * bs) +
                 " tokens of text, got " + std::to_string(n_text) +
                 (n_text >= static_cast<size_t>(2 * bs) ? " (the context or KV pool holds fewer)" : "")};
  }
  if (n < kKvCalibrationTokens) {
    // Fewer statistics allocate bits less well (docs/perf.md, "k4a stage
    // 2"); the widths are still deterministic and kv_numerics names them.
    std::fprintf(
        stderr, "%s: KV type q4a calibrated its widths on %lld tokens, not %lld (%s)\n", path.c_str(),
        static_cast<long long>(n), static_cast<long long>(kKvCalibrationTokens),
        static_cast<int64_t>(n_text) < room ? "the calibration text is shorter" : "the context or KV pool holds fewer");
  }
  return n;
}

Status CpuPagedModel::calibrate_kv(const std::vector<int32_t>& tokens, const std::vector<KvRopePairs>& rope) {
  assert(static_cast<int64_t>(rope.size()) == kv_.n_layers());
  bool any = false;
  for (int64_t l = 0; l < kv_.n_layers(); ++l) any = any || kv_.types(l).k.dtype == kKvQ4Alloc;
  if (!any) return {};
  const int64_t bs = kv_.block_size();
  RILL_ASSIGN_OR_RETURN(const int64_t n,
                        kv_calibration_length(files_->path, tokens.size(), n_ctx_, int64_t{kv_.n_blocks()} * bs, bs));
  std::vector<int32_t> table(static_cast<size_t>((n + bs - 1) / bs));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> logits(static_cast<size_t>(cfg_.n_vocab));
  kv_.begin_calibration();
  Status st;
  Batch batch;
  for (int64_t c0 = 0; c0 < n && st.ok(); c0 += max_tokens_) {
    const auto len = static_cast<int32_t>(std::min<int64_t>(max_tokens_, n - c0));
    batch.clear();
    batch.add_sequence(tokens.data() + c0, len, static_cast<int32_t>(c0), /*sample_last=*/true, table);
    // Every KV group reads the same blocks: each layer has its own plane.
    batch.group_tables.assign(std::max<size_t>(kv_spec_.size(), 1) - 1, table);
    batch.seqs.back().kv_tail = 0;
    batch.seqs.back().decode_from = static_cast<int32_t>(n);  // every query in the prefill form
    st = forward(batch, logits.data());
  }
  const std::vector<KvCalibrationStats> stats = kv_.end_calibration();
  if (!st.ok()) return Error{files_->path + ": q4a's calibration pass: " + st.error().message};
  for (int64_t l = 0; l < kv_.n_layers(); ++l) {
    if (kv_.types(l).k.dtype != kKvQ4Alloc) continue;
    const KvCalibrationStats& s = stats[static_cast<size_t>(l)];
    const KvRopePairs& r = rope[static_cast<size_t>(l)];
    const auto pairs = r.interleaved ? cpu::RopePairs::kInterleaved : cpu::RopePairs::kNeox;
    std::vector<uint8_t> widths(static_cast<size_t>(kv_.width(l)));
    // No channel at 1 bit (docs/perf.md, "k4a stage 2": the 1-bit encoder
    // loses to z alone, and the allocation without it lowers KL).
    cpu::allocate_channel_bits(s.query_energy.data(), s.block_range_sq.data(), kv_.width(l), kv_.head_dim(l), pairs,
                               widths.data(), /*one_bit=*/false, r.rot_dim, r.rotated_pairs);
    kv_.set_k_widths(l, std::move(widths));
  }
  return {};
}

}  // namespace rill
