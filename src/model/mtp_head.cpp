#include "model/mtp_head.h"

#include <string>

#include "model/layers.h"
#include "model/placement.h"

namespace rill {

Result<MtpHeadWeights> bind_mtp_head(const ModelFiles& f, const MtpLayers& found, const WeightView& embed,
                                     const WeightView& lm_head) {
  const int64_t E = f.config.n_embd, V = f.config.n_vocab;
  const bool nextn = found.naming == MtpLayers::Naming::kNextn;
  const std::string p = nextn ? found.prefixes.at(0) : "mtp.";
  const std::string eh = p + (nextn ? "eh_proj.weight" : "fc.weight");
  MtpHeadWeights w;
  RILL_ASSIGN_OR_RETURN(w.enorm, load_vector(f, p + (nextn ? "enorm.weight" : "pre_fc_norm_embedding.weight"), E));
  RILL_ASSIGN_OR_RETURN(w.hnorm, load_vector(f, p + (nextn ? "hnorm.weight" : "pre_fc_norm_hidden.weight"), E));
  RILL_ASSIGN_OR_RETURN(w.head_norm, load_vector(f, p + (nextn ? "shared_head.norm.weight" : "norm.weight"), E));
  w.embed = embed;
  w.head = lm_head;
  if (nextn && f.find(p + "embed_tokens.weight")) {
    RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, p + "embed_tokens.weight", V, E));
  }
  if (nextn && f.find(p + "shared_head.head.weight")) {
    RILL_ASSIGN_OR_RETURN(w.head, bind_matrix(f, p + "shared_head.head.weight", V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.eh, bind_matrix(f, eh, E, 2 * E));
  if (w.eh.dtype != DType::kF32 && w.eh.dtype != DType::kF16 && w.eh.dtype != DType::kBF16)
    return Error{f.path + ": '" + eh + "' in " + std::string(dtype_name(w.eh.dtype)) +
                 " (F32, F16 or BF16 only for now)"};
  return w;
}

Status place_mtp_head(Backend& b, const MtpHeadWeights& w, const WeightView& model_embed, const Weight& embed_placed,
                      const WeightView& model_head, const Weight& head_placed, MtpHead& out) {
  const int64_t E = static_cast<int64_t>(w.enorm.size());
  out.embed = embed_placed;
  if (w.embed.data != model_embed.data) {
    HostMatrix m = host_matrix(w.embed);
    m.gathered = true;
    RILL_ASSIGN_OR_RETURN(out.embed, b.place(&m, 1, "mtp embed_tokens.weight"));
  }
  out.head = head_placed;
  if (w.head.data != model_head.data) {
    const HostMatrix m = host_matrix(w.head);
    RILL_ASSIGN_OR_RETURN(out.head, b.place(&m, 1, "mtp shared_head.head.weight"));
  }
  RILL_ASSIGN_OR_RETURN(out.enorm, b.place_vector(w.enorm.data(), E, "mtp enorm"));
  RILL_ASSIGN_OR_RETURN(out.hnorm, b.place_vector(w.hnorm.data(), E, "mtp hnorm"));
  RILL_ASSIGN_OR_RETURN(out.head_norm, b.place_vector(w.head_norm.data(), E, "mtp head norm"));
  HostMatrix half = host_matrix(w.eh);
  half.cols = E;
  // A row's FP8 scale covers both halves: each half is requantized from
  // `data` (as tensor_split does for column slices), never read as stored.
  half.e4m3 = nullptr;
  half.e4m3_scales = nullptr;
  RILL_ASSIGN_OR_RETURN(out.eh_e, b.place(&half, 1, "mtp eh_proj (embedding columns)"));
  half.data = static_cast<const uint8_t*>(half.data) + row_bytes(w.eh.dtype, E);
  RILL_ASSIGN_OR_RETURN(out.eh_h, b.place(&half, 1, "mtp eh_proj (hidden columns)"));
  return Status::Ok();
}

Status mtp_head_input(Backend& b, const MtpHead& m, const int32_t* ids, int64_t n, Tensor hidden, Tensor x, Tensor h,
                      Tensor hnormed) {
  b.embed(m.embed, ids, n, x);
  b.rms_norm(x, nullptr, m.enorm, m.eps, m.w_offset, h);
  b.rms_norm(hidden, nullptr, m.hnorm, m.eps, m.w_offset, hnormed);
  RILL_TRY(b.matmul(m.eh_e, h, x, false));
  return b.matmul(m.eh_h, hnormed, x, true);
}

Status mtp_head_logits(Backend& b, const MtpHead& m, Tensor x, const int32_t* sample_rows, Tensor final_rows,
                       Tensor logits, const Tensor* out) {
  if (out && m.feed_back_normed) {
    b.rms_norm(x, nullptr, m.head_norm, m.eps, m.w_offset, *out);
  } else if (out) {
    b.convert(x, *out);
  }
  if (final_rows.rows <= 0) return Status::Ok();
  b.rms_norm(x, sample_rows, m.head_norm, m.eps, m.w_offset, final_rows);
  return b.matmul(m.head, final_rows, logits, false);
}

}  // namespace rill
