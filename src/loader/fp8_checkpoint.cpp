#include "loader/fp8_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <tuple>

#include "core/half.h"
#include "core/thread_pool.h"

namespace rill {
namespace {

using json = nlohmann::json;

std::string str(int64_t v) {
  return std::to_string(v);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + "]";
}

// Errors about config.json's quantization_config name the field by its path.
struct ConfigReader {
  const std::string& path;
  Error bad(const std::string& field, const std::string& what) const {
    return Error{path + ": quantization_config" + (field.empty() ? "" : "." + field) + " " + what};
  }
  // Every key of `obj` must be in `known`.
  Status only(const json& obj, const std::string& at, std::initializer_list<const char*> known) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool found = false;
      for (const char* k : known) found = found || it.key() == k;
      if (!found) return bad(at + it.key(), "is not supported (rill reads FP8 weights only)");
    }
    return Status::Ok();
  }
  static bool is_null_or_absent(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null();
  }
};

Result<std::pair<int64_t, int64_t>> read_block(const ConfigReader& c, const json& v, const std::string& field) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
      v[0].get<int64_t>() <= 0 || v[1].get<int64_t>() <= 0) {
    return c.bad(field, "must be two positive integers [rows, cols]");
  }
  return std::make_pair(v[0].get<int64_t>(), v[1].get<int64_t>());
}

Result<Fp8Scheme> parse_transformers_fp8(const ConfigReader& c, const json& q) {
  RILL_TRY(c.only(
      q, "",
      {"quant_method", "activation_scheme", "weight_block_size", "modules_to_not_convert", "dequantize", "fmt"}));
  Fp8Scheme s;
  s.layout = Fp8Scheme::Layout::kFp8;
  s.strategy = Fp8Scheme::Strategy::kBlock;
  s.scale_suffix = "_scale_inv";
  if (auto a = q.find("activation_scheme"); a != q.end() && *a != "dynamic") {
    return c.bad("activation_scheme", "is " + a->dump() + "; only \"dynamic\" is supported (static input scales)");
  }
  if (auto f = q.find("fmt"); f != q.end() && *f != "e4m3") {  // DeepSeek-V3's configs name it
    return c.bad("fmt", "is " + f->dump() + "; only \"e4m3\" is supported");
  }
  if (auto d = q.find("dequantize"); d != q.end() && *d != false) {
    return c.bad("dequantize", "must be false (rill keeps FP8 weights where the backend runs them)");
  }
  if (auto m = q.find("modules_to_not_convert"); m != q.end() && !m->is_null() && !m->is_array()) {
    return c.bad("modules_to_not_convert", "must be a list");
  }
  auto b = q.find("weight_block_size");
  if (b == q.end()) {
    s.block_rows = s.block_cols = 128;  // transformers' default
  } else {
    RILL_ASSIGN_OR_RETURN(auto block, read_block(c, *b, "weight_block_size"));
    std::tie(s.block_rows, s.block_cols) = block;
  }
  return s;
}

// One config group's "weights" (what the scales mean) and
// "input_activations" (dynamic only).
Result<Fp8Scheme> parse_group(const ConfigReader& c, const json& g, const std::string& at) {
  if (!g.is_object()) return c.bad(at, "must be an object");
  RILL_TRY(c.only(g, at + ".", {"targets", "weights", "input_activations", "output_activations", "format"}));
  if (!ConfigReader::is_null_or_absent(g, "output_activations")) {
    return c.bad(at + ".output_activations", "must be null (output quantization is not supported)");
  }
  if (auto f = g.find("format"); f != g.end() && !f->is_null() && *f != "float-quantized") {
    return c.bad(at + ".format", "is " + f->dump() + "; only \"float-quantized\" is supported");
  }
  auto w = g.find("weights");
  if (w == g.end() || !w->is_object()) return c.bad(at + ".weights", "must be an object");
  const std::string wat = at + ".weights.";
  RILL_TRY(c.only(*w, wat,
                  {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic", "actorder",
                   "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}));
  if (w->value("num_bits", json()) != 8 || w->value("type", json()) != "float") {
    return c.bad(wat + "num_bits", "and type must be 8 and \"float\" (FP8 e4m3)");
  }
  if (auto sym = w->find("symmetric"); sym != w->end() && *sym != true) {
    return c.bad(wat + "symmetric", "must be true (zero points are not supported)");
  }
  if (auto d = w->find("dynamic"); d != w->end() && *d != false) {
    return c.bad(wat + "dynamic", "must be false (weights carry their scales)");
  }
  for (const char* k : {"group_size", "actorder", "zp_dtype"}) {
    if (!ConfigReader::is_null_or_absent(*w, k)) return c.bad(wat + k, "must be null");
  }
  Fp8Scheme s;
  s.layout = Fp8Scheme::Layout::kCompressedTensors;
  s.scale_suffix = "_scale";
  const json strategy = w->value("strategy", json());
  if (strategy == "tensor") {
    s.strategy = Fp8Scheme::Strategy::kTensor;
  } else if (strategy == "channel") {
    s.strategy = Fp8Scheme::Strategy::kChannel;
  } else if (strategy == "block") {
    s.strategy = Fp8Scheme::Strategy::kBlock;
    auto b = w->find("block_structure");
    if (b == w->end()) return c.bad(wat + "block_structure", "is missing for strategy \"block\"");
    RILL_ASSIGN_OR_RETURN(auto block, read_block(c, *b, wat + "block_structure"));
    std::tie(s.block_rows, s.block_cols) = block;
  } else {
    return c.bad(wat + "strategy", "is " + strategy.dump() + "; supported: \"tensor\", \"channel\", \"block\"");
  }
  if (auto a = g.find("input_activations"); a != g.end() && !a->is_null()) {
    const std::string aat = at + ".input_activations.";
    if (!a->is_object()) return c.bad(at + ".input_activations", "must be an object or null");
    if (a->value("dynamic", json()) != true) {
      return c.bad(aat + "dynamic", "must be true (static input scales are not supported)");
    }
    if (a->value("num_bits", json()) != 8 || a->value("type", json()) != "float") {
      return c.bad(aat + "num_bits", "and type must be 8 and \"float\"");
    }
  }
  return s;
}

Result<Fp8Scheme> parse_compressed_tensors(const ConfigReader& c, const json& q) {
  RILL_TRY(c.only(q, "",
                  {"quant_method", "format", "config_groups", "ignore", "quantization_status", "kv_cache_scheme",
                   "sparsity_config", "transform_config", "global_compression_ratio", "version", "provider"}));
  if (q.value("format", json()) != "float-quantized") {
    return c.bad("format", "is " + q.value("format", json()).dump() + "; only \"float-quantized\" is supported");
  }
  if (auto st = q.find("quantization_status"); st != q.end() && *st != "compressed") {
    return c.bad("quantization_status", "is " + st->dump() + "; only \"compressed\" checkpoints are supported");
  }
  for (const char* k : {"kv_cache_scheme", "transform_config"}) {
    if (!ConfigReader::is_null_or_absent(q, k)) return c.bad(k, "must be null (not supported)");
  }
  if (auto sp = q.find("sparsity_config"); sp != q.end() && !sp->is_null() && !sp->empty()) {
    return c.bad("sparsity_config", "must be null or empty (sparse weights are not supported)");
  }
  if (auto ig = q.find("ignore"); ig != q.end() && !ig->is_null() && !ig->is_array()) {
    return c.bad("ignore", "must be a list");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return c.bad("config_groups", "must be an object of one or more groups");
  }
  std::optional<Fp8Scheme> scheme;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string at = "config_groups." + it.key();
    RILL_ASSIGN_OR_RETURN(Fp8Scheme s, parse_group(c, it.value(), at));
    if (scheme &&
        (s.strategy != scheme->strategy || s.block_rows != scheme->block_rows || s.block_cols != scheme->block_cols)) {
      return c.bad(at + ".weights", "differs from another group's weights (one scheme per checkpoint is supported)");
    }
    scheme = s;
  }
  return *scheme;
}

// Where scale (i, j) covers weight rows [i * br, ...) and columns [j * bc, ...).
struct ScaleGrid {
  int64_t br = 0, bc = 0, n_i = 0, n_j = 0;
};

ScaleGrid grid_of(const Fp8Scheme& s, int64_t rows, int64_t cols) {
  switch (s.strategy) {
    case Fp8Scheme::Strategy::kTensor:
      return {rows, cols, 1, 1};
    case Fp8Scheme::Strategy::kChannel:
      return {1, cols, rows, 1};
    case Fp8Scheme::Strategy::kBlock:
      break;
  }
  return {s.block_rows, s.block_cols, (rows + s.block_rows - 1) / s.block_rows,
          (cols + s.block_cols - 1) / s.block_cols};
}

// Whether the scale tensor's shape is the grid's: tensor scales may be
// [] or [1] (or [1, 1]); channel scales [rows, 1] or [rows].
bool shape_fits(const Fp8Scheme& s, const std::vector<int64_t>& shape, const ScaleGrid& g) {
  if (shape == std::vector<int64_t>{g.n_i, g.n_j}) return true;
  switch (s.strategy) {
    case Fp8Scheme::Strategy::kTensor:
      return shape.empty() || shape == std::vector<int64_t>{1};
    case Fp8Scheme::Strategy::kChannel:
      return shape == std::vector<int64_t>{g.n_i};
    case Fp8Scheme::Strategy::kBlock:
      break;
  }
  return false;
}

float scale_value(const SafetensorsTensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    default: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
  }
}

// Every byte's value, for the dequantization loop.
struct Float8Table {
  float values[256];
  explicit Float8Table(float (*decode)(uint8_t)) {
    for (int b = 0; b < 256; ++b) values[b] = decode(static_cast<uint8_t>(b));
  }
};
const Float8Table kE4m3(&e4m3_to_f32), kE5m2(&e5m2_to_f32);

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

float e5m2_to_f32(uint8_t b) {
  return f16_to_f32(static_cast<uint16_t>(b << 8));  // e5m2 is the top byte of an IEEE half
}

Result<Fp8Scheme> parse_fp8_scheme(const json& config, const std::string& config_path) {
  auto q = config.find("quantization_config");
  if (q == config.end() || q->is_null()) return Fp8Scheme{};
  const ConfigReader c{config_path};
  if (!q->is_object()) return c.bad("", "must be an object");
  const json method = q->value("quant_method", json());
  if (method == "fp8") return parse_transformers_fp8(c, *q);
  if (method == "compressed-tensors") return parse_compressed_tensors(c, *q);
  if (method == "mxfp4") return Fp8Scheme{};  // loader/mxfp4_checkpoint.h reads it
  return c.bad("quant_method", "is " + method.dump() +
                                   "; supported: \"fp8\" and \"compressed-tensors\" (float-quantized FP8), "
                                   "\"mxfp4\" (gpt-oss experts). GGUF files carry rill's other quantized types");
}

Result<Fp8Weights> read_fp8_weights(const SafetensorsCheckpoint& ck, const Fp8Scheme& scheme,
                                    const std::string& config_path) {
  Fp8Weights out;
  struct Job {
    const SafetensorsTensor* weight;
    const SafetensorsTensor* scale;
    ScaleGrid grid;
  };
  std::vector<Job> jobs;  // parallel to out.weights
  auto tensor_at = [&](const std::pair<size_t, size_t>& loc) -> const SafetensorsTensor& {
    return ck.files[loc.first].tensors[loc.second];
  };
  for (const auto& [name, loc] : ck.tensors) {
    const SafetensorsTensor& t = tensor_at(loc);
    const std::string& file = ck.file_paths[loc.first];
    // A named copy: clang 14 cannot capture a structured binding in a lambda.
    auto bad = [&, &tensor = name](const std::string& what) {
      return Error{file + ": tensor '" + tensor + "' " + what};
    };
    if (ends_with(name, ".input_scale")) {
      return bad("is a static input scale; only dynamic activation quantization is supported");
    }
    if (scheme.layout != Fp8Scheme::Layout::kNone && ends_with(name, ".weight" + scheme.scale_suffix)) {
      const std::string weight = name.substr(0, name.size() - scheme.scale_suffix.size());
      auto w = ck.tensors.find(weight);
      if (w == ck.tensors.end() || tensor_at(w->second).float8 == Float8::kNone) {
        return bad("is a scale but '" + weight + "' is not an FP8 weight");
      }
      out.scale_tensors.insert(name);
      continue;
    }
    if (t.float8 == Float8::kNone) continue;
    if (scheme.layout == Fp8Scheme::Layout::kNone) {
      return bad("is FP8 but " + config_path + " has no quantization_config saying how it is scaled");
    }
    if (!ends_with(name, ".weight") || t.shape.size() != 2) {
      return bad("is FP8 with shape " + shape_string(t.shape) + "; only 2-D '<module>.weight' tensors can be FP8");
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const std::string scale_name = name + scheme.scale_suffix;
    auto s = ck.tensors.find(scale_name);
    if (s == ck.tensors.end()) return bad("is FP8 but its scale '" + scale_name + "' is missing");
    const SafetensorsTensor& st = tensor_at(s->second);
    const std::string& scale_file = ck.file_paths[s->second.first];
    const ScaleGrid g = grid_of(scheme, rows, cols);
    if (st.float8 != Float8::kNone || st.u8 ||
        (st.dtype != DType::kF32 && st.dtype != DType::kBF16 && st.dtype != DType::kF16)) {
      return Error{scale_file + ": tensor '" + scale_name + "' must be F32, BF16 or F16"};
    }
    if (!shape_fits(scheme, st.shape, g)) {
      return Error{scale_file + ": tensor '" + scale_name + "' has shape " + shape_string(st.shape) + ", expected " +
                   shape_string({g.n_i, g.n_j}) + " for the FP8 weight '" + name + "' " + shape_string(t.shape)};
    }
    Fp8Weight w;
    w.name = name;
    w.rows = rows;
    w.cols = cols;
    w.values.resize(static_cast<size_t>(rows * cols));
    if (g.n_j == 1 && t.float8 == Float8::kE4M3) {
      w.e4m3 = t.data;
      w.row_scales.resize(static_cast<size_t>(rows));
    }
    jobs.push_back({&t, &st, g});
    out.weights.push_back(std::move(w));
  }
  // Dequantization: a table lookup and a multiply per weight, over all
  // cores (an 8B checkpoint holds ~7e9 FP8 weights).
  std::optional<ThreadPool> pool;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    Fp8Weight& w = out.weights[i];
    const float* table = job.weight->float8 == Float8::kE4M3 ? kE4m3.values : kE5m2.values;
    const int64_t cols = w.cols;
    auto rows = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* q = job.weight->data + r * cols;
        float* v = w.values.data() + r * cols;
        for (int64_t j = 0; j < job.grid.n_j; ++j) {
          const float scale = scale_value(*job.scale, (r / job.grid.br) * job.grid.n_j + j);
          if (w.e4m3) w.row_scales[static_cast<size_t>(r)] = scale;
          const int64_t c1 = std::min(cols, (j + 1) * job.grid.bc);
          for (int64_t c = j * job.grid.bc; c < c1; ++c) v[c] = table[q[c]] * scale;
        }
      }
    };
    if (w.rows * cols < (int64_t{1} << 20)) {
      rows(0, w.rows);
      continue;
    }
    if (!pool) pool.emplace(0);
    pool->parallel_for(w.rows, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)), rows);
  }
  return out;
}

}  // namespace rill
