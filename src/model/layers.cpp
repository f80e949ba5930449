#include "model/layers.h"

#include "core/half.h"

namespace rill {

cpu::RopeScalingParams rope_scaling_params(const RopeScaling& s) {
  cpu::RopeScalingParams rs;
  using ScalingType = cpu::RopeScalingParams::Type;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      rs.type = ScalingType::kNone;
      break;
    case RopeScaling::Type::kLinear:
      rs.type = ScalingType::kLinear;
      break;
    case RopeScaling::Type::kLlama3:
      rs.type = ScalingType::kLlama3;
      break;
    case RopeScaling::Type::kYarn:
      rs.type = ScalingType::kYarn;
      break;
    case RopeScaling::Type::kProportional:  // refused by every family but Gemma, which builds its own table
      rs.type = ScalingType::kNone;
      break;
    case RopeScaling::Type::kLongRope:  // minicpm only: the Llama family divides by the factors itself
      rs.type = ScalingType::kNone;
      break;
  }
  rs.factor = s.factor;
  rs.low_freq_factor = s.low_freq_factor;
  rs.high_freq_factor = s.high_freq_factor;
  rs.original_max_position = s.original_max_position;
  rs.beta_fast = s.beta_fast;
  rs.beta_slow = s.beta_slow;
  rs.attention_factor = s.attention_factor;
  rs.truncate = s.truncate;
  return rs;
}

WeightView weight_view(const TensorRef& t) {
  WeightView v;
  v.dtype = t.dtype;
  v.n_rows = t.shape.size() == 1 ? 1 : t.shape[0];
  v.n_cols = t.shape.back();
  v.data = t.data;
  v.row_stride = row_bytes(t.dtype, v.n_cols);
  v.fp8 = t.fp8;
  v.e4m3 = t.e4m3;
  v.e4m3_scales = t.e4m3_scales;
  return v;
}

Result<WeightView> bind_matrix(const ModelFiles& files, const std::string& name, int64_t n_rows, int64_t n_cols) {
  RILL_ASSIGN_OR_RETURN(const TensorRef* t, files.require(name, {n_rows, n_cols}));
  if (n_cols % dtype_info(t->dtype).block_size != 0) {
    return Error{t->file + ": tensor '" + name + "' rows of " + std::to_string(n_cols) +
                 " elements are not a whole number of " + std::string(dtype_name(t->dtype)) + " blocks"};
  }
  return weight_view(*t);
}

Result<std::vector<float>> load_vector(const ModelFiles& files, const std::string& name, int64_t n) {
  RILL_ASSIGN_OR_RETURN(const TensorRef* t, files.require(name, {n}));
  std::vector<float> out(static_cast<size_t>(n));
  switch (t->dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      cpu::dequantize_row(t->dtype, t->data, out.data(), n);
      return out;
    default:
      return Error{t->file + ": tensor '" + name + "' has type " + std::string(dtype_name(t->dtype)) +
                   ", expected F32, F16 or BF16"};
  }
}

Result<Linear> bind_linear(const ModelFiles& files, const std::string& name, int64_t n_out, int64_t n_in, Bias bias) {
  Linear l;
  RILL_ASSIGN_OR_RETURN(l.w, bind_matrix(files, name + ".weight", n_out, n_in));
  if (bias != Bias::kNone) {
    const std::string bias_name = name + ".bias";
    if (bias == Bias::kRequired || files.find(bias_name)) {
      RILL_ASSIGN_OR_RETURN(l.bias, load_vector(files, bias_name, n_out));
    }
  }
  return l;
}

}  // namespace rill
