#include "loader/model_files.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loader/gguf.h"
#include "loader/gguf_names.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"

namespace rill {

int64_t TensorRef::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorRef::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const TensorRef* ModelFiles::find(std::string_view name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

Result<const TensorRef*> ModelFiles::require(std::string_view name, const std::vector<int64_t>& shape) const {
  const TensorRef* t = find(name);
  if (!t) return Error{path + ": missing tensor '" + std::string(name) + "'"};
  if (t->shape != shape) {
    TensorRef expected;
    expected.shape = shape;
    return Error{t->file + ": tensor '" + t->name + "' has shape " + t->shape_string() + ", expected " +
                 expected.shape_string()};
  }
  return t;
}

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open"};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<std::shared_ptr<ModelFiles>> open_gguf(const std::string& path) {
  RILL_ASSIGN_OR_RETURN(std::shared_ptr<GgufFile> gguf, GgufFile::open(path));
  auto files = std::make_shared<ModelFiles>();
  files->format = ModelFormat::kGguf;
  files->path = path;
  const std::string arch = gguf->get_string("general.architecture").value_or("");
  for (const GgufTensorInfo& info : gguf->tensors()) {
    if (!dtype_info(info.type))
      return Error{path + ": tensor '" + info.name + "' has unsupported type " +
                   std::string(ggml_type_name(info.type))};
    TensorRef t;
    t.name = gguf_to_hf_tensor_name(info.name, arch).value_or(info.name);
    t.file = path;
    t.dtype = static_cast<DType>(info.type);
    t.shape.assign(info.ne.rbegin(), info.ne.rend());  // GGML ne is innermost first
    t.data = info.data;
    t.n_bytes = info.n_bytes;
    auto [it, inserted] = files->tensors.emplace(t.name, t);
    if (!inserted)
      return Error{path + ": tensor '" + info.name + "' maps to '" + t.name + "', which another tensor already has"};
  }
  RILL_ASSIGN_OR_RETURN(files->config, gguf_model_config(*gguf));
  if (auto tmpl = gguf->get_string("tokenizer.chat_template")) files->chat_template = *tmpl;
  files->gguf = std::move(gguf);  // keeps the mapping (and every TensorRef::data) alive
  return files;
}

// tokenizer_config.json "chat_template": a string, or a list of
// {"name", "template"} of which the "default" one is the chat template.
Result<std::string> template_from_tokenizer_config(const std::string& path) {
  RILL_ASSIGN_OR_RETURN(std::string text, read_text(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error{path + ": not a valid JSON object"};
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return Error{path + ": field 'chat_template' must be a string or a list"};
  for (const auto& entry : *it) {
    if (!entry.is_object()) return Error{path + ": 'chat_template' list entries must be objects"};
    auto name = entry.find("name");
    auto tmpl = entry.find("template");
    if (name != entry.end() && name->is_string() && *name == "default") {
      if (tmpl == entry.end() || !tmpl->is_string())
        return Error{path + ": chat_template 'default' has no string 'template'"};
      return tmpl->get<std::string>();
    }
  }
  return std::string();
}

Result<std::shared_ptr<ModelFiles>> open_hf_dir(const std::string& dir) {
  auto files = std::make_shared<ModelFiles>();
  files->format = ModelFormat::kHuggingFace;
  files->path = dir;
  RILL_ASSIGN_OR_RETURN(files->config, load_hf_config(dir));
  RILL_ASSIGN_OR_RETURN(SafetensorsCheckpoint ck, open_safetensors_checkpoint(dir));
  const std::string config_path = (fs::path(dir) / "config.json").string();
  RILL_ASSIGN_OR_RETURN(const Fp8Scheme scheme, parse_fp8_scheme(files->config.raw, config_path));
  RILL_ASSIGN_OR_RETURN(files->fp8, read_fp8_weights(ck, scheme, config_path));
  RILL_ASSIGN_OR_RETURN(const Mxfp4Scheme mxfp4, parse_mxfp4_scheme(files->config.raw, config_path));
  RILL_ASSIGN_OR_RETURN(files->mxfp4, read_mxfp4_weights(ck, mxfp4, files->config.architecture, config_path));
  for (const auto& [name, loc] : ck.tensors) {
    const SafetensorsTensor& st = ck.files[loc.first].tensors[loc.second];
    if (st.float8 != Float8::kNone || files->fp8.scale_tensors.count(name)) continue;  // below
    if (st.u8) continue;  // MXFP4 blocks and scales (below); other U8 tensors are buffers no graph reads
    TensorRef t;
    t.name = name;
    t.file = ck.file_paths[loc.first];
    t.dtype = st.dtype;
    t.shape = st.shape;
    t.data = st.data;
    t.n_bytes = st.n_bytes;
    files->tensors.emplace(name, std::move(t));
  }
  for (const Fp8Weight& w : files->fp8.weights) {
    const auto& loc = ck.tensors.find(w.name)->second;
    TensorRef t;
    t.name = w.name;
    t.file = ck.file_paths[loc.first];
    t.dtype = DType::kF32;
    t.shape = {w.rows, w.cols};
    t.data = reinterpret_cast<const uint8_t*>(w.values.data());
    t.n_bytes = w.values.size() * 4;
    t.fp8 = true;
    t.e4m3 = w.e4m3;
    t.e4m3_scales = w.e4m3 ? w.row_scales.data() : nullptr;
    files->tensors.emplace(w.name, std::move(t));
  }
  for (const Mxfp4Tensor& m : files->mxfp4.tensors) {
    TensorRef t;
    t.name = m.name;
    t.file = ck.file_paths[m.file];
    t.dtype = DType::kMXFP4;
    t.shape = m.shape;
    t.data = m.blocks.get();
    t.n_bytes = m.n_bytes;
    auto [it, inserted] = files->tensors.emplace(m.name, std::move(t));
    if (!inserted) {
      return Error{ck.file_paths[m.file] + ": tensor '" + m.name + "' is stored both dense and as MXFP4 ('" + m.name +
                   "_blocks')"};
    }
  }
  // Moving a MappedFile keeps its address range, so the pointers above stay valid.
  for (auto& f : ck.files) files->mappings.push_back(std::move(f.mapping));

  std::error_code ec;
  const std::string tok_json = (fs::path(dir) / "tokenizer.json").string();
  const std::string tok_config = (fs::path(dir) / "tokenizer_config.json").string();
  const std::string jinja = (fs::path(dir) / "chat_template.jinja").string();
  if (fs::is_regular_file(tok_json, ec)) files->tokenizer_json_path = tok_json;
  if (fs::is_regular_file(tok_config, ec)) {
    files->tokenizer_config_path = tok_config;
    RILL_ASSIGN_OR_RETURN(files->chat_template, template_from_tokenizer_config(tok_config));
  }
  // transformers saves the template as chat_template.jinja since 4.43 and
  // prefers that file when both exist; so do we.
  if (fs::is_regular_file(jinja, ec)) {
    RILL_ASSIGN_OR_RETURN(files->chat_template, read_text(jinja));
  }
  return files;
}

}  // namespace

Result<std::shared_ptr<ModelFiles>> open_model_files(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return open_hf_dir(path);
  if (!fs::exists(path, ec)) return Error{path + ": no such file or directory"};
  if (ends_with(path, ".gguf") || (fs::is_regular_file(path, ec) && starts_with_gguf_magic(path)))
    return open_gguf(path);
  return Error{path + ": not a GGUF file or a Hugging Face model directory"};
}

}  // namespace rill
