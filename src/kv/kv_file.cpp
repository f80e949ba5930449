#include "kv/kv_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/e4m3.h"
#include "core/hash.h"

namespace rill {
namespace {

using nlohmann::json;

constexpr char kMagic[8] = {'R', 'I', 'L', 'L', 'K', 'V', '2', '\n'};
constexpr size_t kFixedBytes = 8 + 4 + 4 + 8;
// Headers hold the token ids and a few hundred tensor descriptions; a
// length beyond this is corruption, not a real file.
constexpr uint32_t kMaxHeaderBytes = 64u << 20;

const char* kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::kFull:
      return "full";
    case LayerKind::kSliding:
      return "sliding";
    case LayerKind::kRecurrent:
      return "recurrent";
  }
  return "full";
}

bool parse_kind(const std::string& s, LayerKind* k) {
  if (s == "full")
    *k = LayerKind::kFull;
  else if (s == "sliding")
    *k = LayerKind::kSliding;
  else if (s == "recurrent")
    *k = LayerKind::kRecurrent;
  else
    return false;
  return true;
}

bool parse_hex64(const json& j, uint64_t* out) {
  if (!j.is_string()) return false;
  const std::string& s = j.get_ref<const std::string&>();
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool parse_dtype(const std::string& s, DType* t) {
  // The KV cache's types (model/kv_types.h).
  for (DType c : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kIQ4_NL, kF8E4M3, kKvQ4Chan, kKvQ4Alloc, kKvIq4Nl64, kKvQ8_0x64}) {
    if (dtype_name(c) == s) {
      *t = c;
      return true;
    }
  }
  return false;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t align_up(uint64_t x) {
  return (x + kKvFileAlignment - 1) / kKvFileAlignment * kKvFileAlignment;
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error{path + ": write failed: " + std::strerror(errno)};
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Fails with `what` naming the file.
Error bad(const std::string& name, const std::string& what) {
  return Error{name + ": not a valid KV file: " + what};
}

}  // namespace

std::string kv_identity_mismatch(const KvFileIdentity& want, const KvFileIdentity& got) {
  if (want.model_id != got.model_id) return "modelId";
  if (want.config_fingerprint != got.config_fingerprint) return "configFingerprint";
  if (want.numerics != got.numerics) return "numerics";
  if (want.ns != got.ns) return "ns";
  if (want.tokenizer_hash != got.tokenizer_hash) return "tokenizerHash";
  return "";
}

Status write_kv_file(const std::string& path, const KvFileIdentity& identity, std::span<const int32_t> tokens,
                     std::span<const KvLayerData> layers) {
  json h;
  h["formatVersion"] = kKvFileFormatVersion;
  h["modelId"] = identity.model_id;
  h["configFingerprint"] = identity.config_fingerprint;
  h["numerics"] = identity.numerics;
  h["ns"] = hex64(identity.ns);
  h["tokenizerHash"] = hex64(identity.tokenizer_hash);
  h["createdAt"] = static_cast<int64_t>(std::time(nullptr));
  h["tokens"] = std::vector<int32_t>(tokens.begin(), tokens.end());
  // Offsets are laid out after the header, whose size depends on them: lay
  // out against a generous header bound, then check it held.
  json jl;
  std::string text;
  uint64_t data_start = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    data_start = align_up(kFixedBytes + (attempt == 0 ? 4096 + tokens.size() * 8 + layers.size() * 512 : text.size()));
    uint64_t off = data_start;
    jl = json::array();
    for (const KvLayerData& l : layers) {
      json jt = json::array();
      for (const KvTensorData& t : l.tensors) {
        jt.push_back({{"name", t.name},
                      {"off", off},
                      {"bytes", t.bytes.size()},
                      {"shape", t.shape},
                      {"dtype", std::string(dtype_name(t.dtype))},
                      {"hash", hex64(hash64(t.bytes.data(), t.bytes.size()))}});
        // Quantized tensors: the elements per scale block (GGML's layout of dtype).
        if (dtype_info(t.dtype).quantized) jt.back()["groupSize"] = dtype_info(t.dtype).block_size;
        off = align_up(off + t.bytes.size());
      }
      json layer = {{"kind", kind_name(l.kind)}, {"tensors", std::move(jt)}};
      if (l.window > 0) layer["window"] = l.window;
      if (l.first_token > 0) layer["firstToken"] = l.first_token;
      jl.push_back(std::move(layer));
    }
    h["layers"] = jl;
    text = h.dump();
    if (kFixedBytes + text.size() <= data_start) break;
  }
  if (kFixedBytes + text.size() > data_start || text.size() > kMaxHeaderBytes) {
    return Error{path + ": KV file header too large (" + std::to_string(text.size()) + " bytes)"};
  }

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error{tmp + ": cannot create: " + std::strerror(errno)};
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  uint8_t fixed[kFixedBytes];
  std::memcpy(fixed, kMagic, 8);
  const auto hlen = static_cast<uint32_t>(text.size());
  const auto dstart = static_cast<uint32_t>(data_start);
  const uint64_t hh = hash64(text.data(), text.size());
  std::memcpy(fixed + 8, &hlen, 4);
  std::memcpy(fixed + 12, &dstart, 4);
  std::memcpy(fixed + 16, &hh, 8);
  if (Status s = write_all(fd, fixed, sizeof(fixed), tmp); !s.ok()) return fail(s);
  if (Status s = write_all(fd, text.data(), text.size(), tmp); !s.ok()) return fail(s);
  uint64_t pos = kFixedBytes + text.size();
  uint64_t next = data_start;  // the offsets the header promises
  static const std::vector<uint8_t> zeros(kKvFileAlignment, 0);
  for (const KvLayerData& l : layers) {
    for (const KvTensorData& t : l.tensors) {
      const uint64_t off = next;
      next = align_up(off + t.bytes.size());
      // Zero padding up to the tensor (at most the header bound's slack).
      while (off - pos > zeros.size()) {
        if (Status s = write_all(fd, zeros.data(), zeros.size(), tmp); !s.ok()) return fail(s);
        pos += zeros.size();
      }
      if (Status s = write_all(fd, zeros.data(), off - pos, tmp); !s.ok()) return fail(s);
      if (Status s = write_all(fd, t.bytes.data(), t.bytes.size(), tmp); !s.ok()) return fail(s);
      pos = off + t.bytes.size();
    }
  }
  if (::fsync(fd) != 0) return fail(Error{tmp + ": fsync failed: " + std::strerror(errno)});
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Error{tmp + ": close failed: " + std::strerror(errno)};
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return Error{path + ": rename failed: " + err};
  }
  // The rename is durable once the directory is synced.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Result<KvFileHeader> parse_kv_header(std::span<const uint8_t> prefix, uint64_t file_size, const std::string& name) {
  if (file_size < kFixedBytes || prefix.size() < kFixedBytes) return bad(name, "shorter than the fixed header");
  if (std::memcmp(prefix.data(), kMagic, 8) != 0) return bad(name, "bad magic");
  const uint32_t hlen = load_u32(prefix.data() + 8);
  const uint32_t dstart = load_u32(prefix.data() + 12);
  const uint64_t hh = load_u64(prefix.data() + 16);
  if (hlen == 0 || hlen > kMaxHeaderBytes) return bad(name, "header length " + std::to_string(hlen));
  if (kFixedBytes + hlen > file_size || kFixedBytes + hlen > prefix.size()) return bad(name, "truncated header");
  if (dstart < kFixedBytes + hlen || dstart % kKvFileAlignment != 0) return bad(name, "bad data start");
  const auto* text = reinterpret_cast<const char*>(prefix.data() + kFixedBytes);
  if (hash64(text, hlen) != hh) return bad(name, "header hash mismatch");
  json h = json::parse(text, text + hlen, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return bad(name, "header is not a JSON object");

  KvFileHeader out;
  auto field = [&](const char* key) -> const json* {
    auto it = h.find(key);
    return it == h.end() ? nullptr : &*it;
  };
  const json* v = field("formatVersion");
  if (!v || !v->is_number_unsigned() || v->get<uint64_t>() != kKvFileFormatVersion) {
    return bad(name, "formatVersion is not " + std::to_string(kKvFileFormatVersion));
  }
  const json* mid = field("modelId");
  const json* cfp = field("configFingerprint");
  if (!mid || !mid->is_string() || !cfp || !cfp->is_string()) return bad(name, "modelId/configFingerprint");
  out.identity.model_id = mid->get<std::string>();
  out.identity.config_fingerprint = cfp->get<std::string>();
  if (const json* num = field("numerics")) {  // absent: written before numerics were recorded ("")
    if (!num->is_string()) return bad(name, "numerics");
    out.identity.numerics = num->get<std::string>();
  }
  const json* ns = field("ns");
  const json* th = field("tokenizerHash");
  if (!ns || !parse_hex64(*ns, &out.identity.ns)) return bad(name, "ns");
  if (!th || !parse_hex64(*th, &out.identity.tokenizer_hash)) return bad(name, "tokenizerHash");
  const json* ca = field("createdAt");
  if (!ca || !ca->is_number_integer()) return bad(name, "createdAt");
  out.created_at = ca->get<int64_t>();
  const json* toks = field("tokens");
  if (!toks || !toks->is_array()) return bad(name, "tokens");
  out.tokens.reserve(toks->size());
  for (const json& t : *toks) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) return bad(name, "tokens");
    out.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  const json* layers = field("layers");
  if (!layers || !layers->is_array()) return bad(name, "layers");
  for (const json& jl : *layers) {
    KvLayerDesc l;
    if (!jl.is_object() || !jl.contains("kind") || !jl["kind"].is_string() ||
        !parse_kind(jl["kind"].get<std::string>(), &l.kind) || !jl.contains("tensors") || !jl["tensors"].is_array()) {
      return bad(name, "layer " + std::to_string(out.layers.size()));
    }
    if (jl.contains("window")) {
      const json& w = jl["window"];
      if (!w.is_number_unsigned() || w.get<uint64_t>() > INT32_MAX) {
        return bad(name, "layer " + std::to_string(out.layers.size()) + " window");
      }
      l.window = static_cast<int32_t>(w.get<uint64_t>());
    }
    if (jl.contains("firstToken")) {
      const json& f = jl["firstToken"];
      if (!f.is_number_unsigned() || f.get<uint64_t>() > out.tokens.size()) {
        return bad(name, "layer " + std::to_string(out.layers.size()) + " firstToken");
      }
      l.first_token = static_cast<int64_t>(f.get<uint64_t>());
    }
    for (const json& jt : jl["tensors"]) {
      KvTensorDesc t;
      const std::string where =
          "layer " + std::to_string(out.layers.size()) + " tensor " + std::to_string(l.tensors.size());
      if (!jt.is_object() || !jt.contains("name") || !jt["name"].is_string() || !jt.contains("off") ||
          !jt["off"].is_number_unsigned() || !jt.contains("bytes") || !jt["bytes"].is_number_unsigned() ||
          !jt.contains("shape") || !jt["shape"].is_array() || !jt.contains("dtype") || !jt["dtype"].is_string() ||
          !jt.contains("hash") || !parse_hex64(jt["hash"], &t.hash) ||
          !parse_dtype(jt["dtype"].get<std::string>(), &t.dtype)) {
        return bad(name, where);
      }
      t.name = jt["name"].get<std::string>();
      t.off = jt["off"].get<uint64_t>();
      t.bytes = jt["bytes"].get<uint64_t>();
      // The shape's size in bytes must equal `bytes` (no overflow).
      uint64_t elems = 1;
      for (const json& d : jt["shape"]) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) return bad(name, where + " shape");
        t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
        if (__builtin_mul_overflow(elems, d.get<uint64_t>(), &elems)) return bad(name, where + " shape");
      }
      const DTypeInfo info = dtype_info(t.dtype);
      if (info.quantized != jt.contains("groupSize") ||
          (info.quantized && (!jt["groupSize"].is_number_unsigned() ||
                              jt["groupSize"].get<uint64_t>() != static_cast<uint64_t>(info.block_size)))) {
        return bad(name, where + " groupSize does not match its dtype");
      }
      if (t.shape.empty() || elems % static_cast<uint64_t>(info.block_size) != 0 ||
          elems / static_cast<uint64_t>(info.block_size) > UINT64_MAX / static_cast<uint64_t>(info.block_bytes) ||
          elems / static_cast<uint64_t>(info.block_size) * static_cast<uint64_t>(info.block_bytes) != t.bytes) {
        return bad(name, where + " bytes do not match its shape");
      }
      if (t.off < dstart || t.off % kKvFileAlignment != 0 || t.off > file_size || t.bytes > file_size - t.off) {
        return bad(name, where + " lies outside the file");
      }
      l.tensors.push_back(std::move(t));
    }
    out.layers.push_back(std::move(l));
  }
  return out;
}

Result<KvFile> KvFile::open(const std::string& path, const KvFileIdentity* expect, bool verify_tensors) {
  KvFile f;
  RILL_ASSIGN_OR_RETURN(f.map_, MappedFile::open(path));
  RILL_ASSIGN_OR_RETURN(f.header_,
                        parse_kv_header(std::span<const uint8_t>(f.map_.data(), f.map_.size()), f.map_.size(), path));
  if (expect) {
    const std::string field = kv_identity_mismatch(*expect, f.header_.identity);
    if (!field.empty()) return Error{path + ": KV file is for another " + field};
  }
  if (verify_tensors) {
    for (size_t l = 0; l < f.header_.layers.size(); ++l) {
      for (size_t t = 0; t < f.header_.layers[l].tensors.size(); ++t) {
        const KvTensorDesc& d = f.header_.layers[l].tensors[t];
        if (hash64(f.map_.data() + d.off, d.bytes) != d.hash) {
          return Error{path + ": KV file tensor " + d.name + " of layer " + std::to_string(l) + " fails its hash"};
        }
      }
    }
  }
  return f;
}

std::span<const uint8_t> KvFile::tensor(size_t layer, size_t t) const {
  const KvTensorDesc& d = header_.layers[layer].tensors[t];
  return {map_.data() + d.off, static_cast<size_t>(d.bytes)};
}

Result<KvFileHeader> read_kv_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Error{path + ": cannot stat: " + std::strerror(errno)};
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  uint8_t fixed[kFixedBytes];
  if (size < kFixedBytes || ::pread(fd, fixed, kFixedBytes, 0) != static_cast<ssize_t>(kFixedBytes)) {
    ::close(fd);
    return bad(path, "shorter than the fixed header");
  }
  const uint32_t hlen = load_u32(fixed + 8);
  if (hlen == 0 || hlen > kMaxHeaderBytes || kFixedBytes + hlen > size) {
    ::close(fd);
    return bad(path, "header length " + std::to_string(hlen));
  }
  std::vector<uint8_t> buf(kFixedBytes + hlen);
  const ssize_t got = ::pread(fd, buf.data(), buf.size(), 0);
  ::close(fd);
  if (got != static_cast<ssize_t>(buf.size())) return bad(path, "truncated header");
  return parse_kv_header(buf, size, path);
}

}  // namespace rill
