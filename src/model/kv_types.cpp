#include "model/kv_types.h"

#include <bit>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/kv_quant.h"
#include "core/e4m3.h"

namespace rill {
namespace {

struct Named {
  std::string_view name;
  KvType type;
};
constexpr Named kTypes[] = {
    {"f32", {DType::kF32, false}},   {"f16", {DType::kF16, false}},       {"bf16", {DType::kBF16, false}},
    {"q8_0", {DType::kQ8_0, false}}, {"q4_0", {DType::kQ4_0, false}},     {"q4_1", {DType::kQ4_1, false}},
    {"q5_0", {DType::kQ5_0, false}}, {"q5_1", {DType::kQ5_1, false}},     {"q4_0h", {DType::kQ4_0, true}},
    {"q8_0h", {DType::kQ8_0, true}}, {"iq4_nlh", {DType::kIQ4_NL, true}}, {"fp8", {kF8E4M3, false}},
    {"q4c", {kKvQ4Chan, false}},     {"iq4_nlh64", {kKvIq4Nl64, true}},   {"q8_0h64", {kKvQ8_0x64, true}},
    {"q4a", {kKvQ4Alloc, false}},
};
// Names of a (K, V) pair, accepted where one type names both sides.
struct NamedPair {
  std::string_view name;
  KvLayerTypes types;
};
constexpr NamedPair kPairs[] = {
    {"k4c", {{kKvQ4Chan, false}, {kKvIq4Nl64, true}}},
    {"k4a", {{kKvQ4Alloc, false}, {kKvIq4Nl64, true}}},
};

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

}  // namespace

int KvType::group_size() const {
  return dtype_info(dtype).block_size;
}

std::string kv_type_name(KvType t) {
  for (const Named& n : kTypes) {
    if (n.type == t) return std::string(n.name);
  }
  return std::string(dtype_name(t.dtype)) + (t.rotated ? "+hadamard" : "");
}

std::optional<KvType> parse_kv_type(std::string_view name) {
  for (const Named& n : kTypes) {
    if (n.name == name) return n.type;
  }
  return std::nullopt;
}

std::optional<KvLayerTypes> parse_kv_pair(std::string_view name) {
  for (const NamedPair& p : kPairs) {
    if (p.name == name) return p.types;
  }
  if (const std::optional<KvType> t = parse_kv_type(name)) return KvLayerTypes{*t, *t};
  return std::nullopt;
}

std::string kv_type_names() {
  std::string s;
  for (const Named& n : kTypes) s += (s.empty() ? "" : ", ") + std::string(n.name);
  for (const NamedPair& p : kPairs) {
    s += ", " + std::string(p.name) + " (k=" + kv_type_name(p.types.k) + " v=" + kv_type_name(p.types.v) + ")";
  }
  return s;
}

Status load_kv_config(const std::string& path, KvTypeOptions& opts) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Error{path + ": is a folder, not a KV config file"};
  std::ifstream in(path);
  if (!in) return Error{path + ": cannot open the KV config file"};
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error{path + ": cannot read the KV config file"};
  return parse_kv_config(text.str(), path, opts);
}

Status parse_kv_config(const std::string& text, const std::string& path, KvTypeOptions& opts) {
  opts.config_path = path;
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const std::string where = path + ":" + std::to_string(line_no);
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string layers;
    if (!(words >> layers)) continue;  // blank or comment
    KvTypeOptions::Entry e;
    e.where = where;
    // N, or N-M (N <= M, both >= 0), or a negative N (from the end).
    const size_t dash = layers.find('-', 1);
    const auto first = parse_int(std::string_view(layers).substr(0, dash));
    const auto last = dash == std::string::npos ? first : parse_int(std::string_view(layers).substr(dash + 1));
    if (!first || !last || (dash != std::string::npos && (*first < 0 || *last < *first))) {
      return Error{where + ": '" + layers + "' is not a layer (N, N-M or a negative N counting from the end)"};
    }
    e.first = *first;
    e.last = *last;
    std::string word;
    bool both = false;  // a bare type was given (both sides)
    while (words >> word) {
      std::optional<KvType>* side = nullptr;
      std::string_view type = word;
      if (word.starts_with("k=")) {
        side = &e.k;
        type.remove_prefix(2);
      } else if (word.starts_with("v=")) {
        side = &e.v;
        type.remove_prefix(2);
      }
      const std::optional<KvType> t = parse_kv_type(type);
      const std::optional<KvLayerTypes> pair = side ? std::nullopt : parse_kv_pair(type);
      if (!t && !pair) {
        return Error{where + ": unknown KV type '" + std::string(type) + "' (one of " + kv_type_names() + ")"};
      }
      if (both || (!side && (e.k || e.v))) {
        return Error{where + ": give one type for both sides or k=T v=T, not both"};
      }
      if (side) {
        if (*side) return Error{where + ": " + word.substr(0, 1) + "= given twice"};
        *side = t;
      } else {
        both = true;
        e.k = pair->k;
        e.v = pair->v;
      }
    }
    if (!e.k && !e.v) return Error{where + ": layer '" + layers + "' names no KV type"};
    opts.layers.push_back(std::move(e));
  }
  return {};
}

bool KvTypeOptions::mentions(DType t) const {
  bool any = (k && k->dtype == t) || (v && v->dtype == t);
  for (const Entry& e : layers) any = any || (e.k && e.k->dtype == t) || (e.v && e.v->dtype == t);
  return any;
}

Result<std::vector<KvLayerTypes>> KvTypeOptions::resolve(int64_t n_layer, DType base) const {
  const KvType base_type{base, false};
  std::vector<KvLayerTypes> out(static_cast<size_t>(n_layer),
                                KvLayerTypes{k.value_or(base_type), v.value_or(base_type)});
  for (const Entry& e : layers) {
    const int64_t first = e.first < 0 ? n_layer + e.first : e.first;
    const int64_t last = e.last < 0 ? n_layer + e.last : e.last;
    if (first < 0 || last >= n_layer) {
      return Error{e.where + ": layer " + std::to_string(e.first) +
                   (e.last != e.first ? "-" + std::to_string(e.last) : "") + " is outside the model's " +
                   std::to_string(n_layer) + " KV layers"};
    }
    for (int64_t l = first; l <= last; ++l) {
      if (e.k) out[static_cast<size_t>(l)].k = *e.k;
      if (e.v) out[static_cast<size_t>(l)].v = *e.v;
    }
  }
  return out;
}

Status check_kv_layer_types(int64_t layer, const KvLayerTypes& types, int64_t n_head_kv, int64_t head_dim) {
  for (const auto& [side, t] : {std::pair{"K", types.k}, std::pair{"V", types.v}}) {
    const std::string what = "KV layer " + std::to_string(layer) + " " + side + " type " + kv_type_name(t);
    // A block of 64 must not span two heads: each head is rotated and read
    // on its own (attention dequantizes a head's blocks, never its neighbour's).
    if (t.dtype == kKvQ8_0x64 && head_dim % 64 != 0) {
      return Error{what + ": q8_0h64 stores each head in blocks of 64 values; head_dim " + std::to_string(head_dim) +
                   " is not a multiple of 64 (use q8_0h, blocks of 32)"};
    }
    if (n_head_kv <= 0 || head_dim <= 0 || (n_head_kv * head_dim) % t.group_size() != 0 ||
        ((t.quantized() || t.rotated) && head_dim > 1024)) {
      return Error{what + ": a KV row of " + std::to_string(n_head_kv) + " heads of " + std::to_string(head_dim) +
                   " is not whole blocks of " + std::to_string(t.group_size()) + " (or head_dim > 1024)"};
    }
    if (kv_chan_k(t.dtype) && (t.rotated || std::string_view(side) != "K")) {
      const std::string n = kv_type_name({t.dtype, false});
      return Error{what + ": " + n + " quantizes K per channel over a block's tokens; V needs a per-token type (" +
                   (t.dtype == kKvQ4Alloc ? "k4a" : "k4c") + ": k=" + n + " v=iq4_nlh64)"};
    }
    // attention_chan reads a head's K channels 16 at a time and its V rows
    // per head (row_bytes(v, head_dim)): both must be whole. (The tail's
    // q8_0 rows need the row whole blocks of 32, which q4c's own block of
    // 32 already asks above.)
    if (kv_chan_k(types.k.dtype) && (head_dim % 16 != 0 || head_dim % types.v.group_size() != 0)) {
      return Error{what + ": " + kv_type_name(types.k) + " K needs head_dim a multiple of 16 and of V's block of " +
                   std::to_string(types.v.group_size()) + ", not " + std::to_string(head_dim)};
    }
    if (t.dtype == kKvIq4Nl64 && !t.rotated) {
      return Error{what + ": iq4_nl64 blocks are stored rotated only (iq4_nlh64)"};
    }
    if (t.dtype == kKvQ8_0x64 && !t.rotated) {
      return Error{what + ": q8_0 blocks of 64 are stored rotated only (q8_0h64)"};
    }
    if (t.dtype == DType::kIQ4_NL && !t.rotated) {
      return Error{what + ": iq4_nl blocks are stored rotated only (iq4_nlh): rill has no GGML iq4_nl encoder"};
    }
    if (t.rotated && !std::has_single_bit(static_cast<uint64_t>(head_dim))) {
      return Error{what + ": the Hadamard rotation needs a power-of-two head_dim, not " + std::to_string(head_dim)};
    }
  }
  return {};
}

Status check_kv_types(const std::vector<KvLayerTypes>& types, int64_t n_head_kv, int64_t head_dim) {
  for (size_t l = 0; l < types.size(); ++l) {
    RILL_TRY(check_kv_layer_types(static_cast<int64_t>(l), types[l], n_head_kv, head_dim));
  }
  return {};
}

std::string describe_kv_types(const std::vector<KvLayerTypes>& types, DType base) {
  const KvLayerTypes plain{{base, false}, {base, false}};
  bool all_plain = true, all_same = true;
  for (const KvLayerTypes& t : types) {
    all_plain = all_plain && t == plain;
    all_same = all_same && t == types.front();
  }
  if (all_plain) return "";
  // Rotated types carry their encoder's revision (rill's own encoder, not
  // GGUF's), so KV stored by another revision does not match.
  auto name = [](KvType t) {
    if (kv_chan_k(t.dtype)) return kv_type_name(t) + "#" + std::to_string(cpu::kKvChanEncoder);
    return kv_type_name(t) + (t.rotated ? "#" + std::to_string(cpu::kKvRotatedEncoder) : "");
  };
  auto pair = [&](const KvLayerTypes& t) { return t.k == t.v ? name(t.k) : "k:" + name(t.k) + "/v:" + name(t.v); };
  if (all_same) return "kv=" + pair(types.front());
  std::string s = "kv=";
  for (size_t l = 0; l < types.size(); ++l) s += (l ? "," : "") + pair(types[l]);
  return s;
}

}  // namespace rill
