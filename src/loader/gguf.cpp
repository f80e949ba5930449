#include "loader/gguf.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace rill {

std::optional<int64_t> GgufValue::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  return std::nullopt;
}

std::optional<double> GgufValue::as_float() const {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::nullopt;
}

const std::string* GgufValue::as_string() const {
  return std::get_if<std::string>(&v);
}

const GgufArray* GgufValue::as_array() const {
  const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v);
  return a ? a->get() : nullptr;
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // the parser guarantees no overflow
  return n;
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;

// Smallest encoding of a value of each type, used to bound counts before
// allocating: a count can never exceed remaining bytes / min size.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
      return 8;  // u64 length
    case GgufType::kArray:
      return 4 + 8;  // element type + count
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kF64);
}

}  // namespace

// Reads one image front to back. Every read is checked against the bytes
// that remain; every error names the file and the item being read.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  Status parse(GgufFile* f) {
    uint32_t magic = 0;
    if (!read(&magic)) return fail("file is too short for a GGUF header (" + std::to_string(size_) + " bytes)");
    if (magic != kMagic) return fail("bad magic (expected GGUF)");
    uint32_t version = 0;
    if (!read(&version)) return truncated("the version");
    if (version == 1) return fail("GGUF version 1 is not supported (convert the file to v3)");
    if (version != 2 && version != 3) {
      // A big-endian file has its version byte-swapped (e.g. 0x03000000).
      if ((version & 0xffff) == 0 && version != 0) return fail("big-endian GGUF files are not supported");
      return fail("unsupported GGUF version " + std::to_string(version) + " (expected 2 or 3)");
    }
    f->version_ = version;

    uint64_t n_tensors = 0, n_kv = 0;
    if (!read(&n_tensors)) return truncated("the tensor count");
    if (!read(&n_kv)) return truncated("the metadata count");
    // Each tensor info takes at least 24 bytes, each key/value at least 13.
    if (n_tensors > remaining() / 24)
      return fail("tensor count " + std::to_string(n_tensors) + " is impossible for a file of " +
                  std::to_string(size_) + " bytes");
    if (n_kv > remaining() / 13)
      return fail("metadata count " + std::to_string(n_kv) + " is impossible for a file of " + std::to_string(size_) +
                  " bytes");

    for (uint64_t i = 0; i < n_kv; ++i) RILL_TRY(read_kv(f, i));
    RILL_TRY(read_alignment(f));

    f->tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) RILL_TRY(read_tensor_info(f, i));

    // Tensor data starts at the next multiple of the alignment.
    uint64_t data_start = pos_;
    const uint64_t rem = data_start % f->alignment_;
    if (rem != 0) data_start += f->alignment_ - rem;  // cannot overflow: pos_ <= size_ and alignment <= 2^30
    f->data_start_ = data_start;
    return check_tensor_data(f);
  }

 private:
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  bool read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  Error fail(const std::string& what) const { return Error{name_ + ": " + what}; }
  Error truncated(const std::string& what) const {
    return fail("truncated at byte " + std::to_string(pos_) + " while reading " + what + " (file has " +
                std::to_string(size_) + " bytes)");
  }

  // `what` is built only on error (hot path: 50k+ token strings).
  template <typename What>
  Status read_string(std::string* out, const What& what) {
    uint64_t len = 0;
    if (!read(&len)) return truncated(what() + " (string length)");
    if (len > remaining())
      return fail(what() + ": string length " + std::to_string(len) + " at byte " + std::to_string(pos_ - 8) +
                  " runs past the end of the file (" + std::to_string(size_) + " bytes)");
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  Status read_kv(GgufFile* f, uint64_t index) {
    std::string key;
    RILL_TRY(read_string(&key, [&] { return "metadata key #" + std::to_string(index); }));
    uint32_t type = 0;
    if (!read(&type)) return truncated("the type of metadata '" + key + "'");
    if (!valid_type(type)) return fail("metadata '" + key + "': unknown value type " + std::to_string(type));
    GgufValue value;
    RILL_TRY(read_value(static_cast<GgufType>(type), key, 0, &value));
    if (f->metadata_.count(key)) return fail("duplicate metadata key '" + key + "'");
    f->metadata_.emplace(std::move(key), std::move(value));
    return Status::Ok();
  }

  Status read_value(GgufType type, const std::string& key, int depth, GgufValue* out) {
    out->type = type;
    auto item = [&] { return "metadata '" + key + "'"; };
    switch (type) {
      case GgufType::kU8:
        return read_scalar<uint8_t, uint64_t>(out, key);
      case GgufType::kI8:
        return read_scalar<int8_t, int64_t>(out, key);
      case GgufType::kU16:
        return read_scalar<uint16_t, uint64_t>(out, key);
      case GgufType::kI16:
        return read_scalar<int16_t, int64_t>(out, key);
      case GgufType::kU32:
        return read_scalar<uint32_t, uint64_t>(out, key);
      case GgufType::kI32:
        return read_scalar<int32_t, int64_t>(out, key);
      case GgufType::kU64:
        return read_scalar<uint64_t, uint64_t>(out, key);
      case GgufType::kI64:
        return read_scalar<int64_t, int64_t>(out, key);
      case GgufType::kF32:
        return read_scalar<float, double>(out, key);
      case GgufType::kF64:
        return read_scalar<double, double>(out, key);
      case GgufType::kBool: {
        uint8_t b = 0;
        if (!read(&b)) return truncated(item());
        if (b > 1) return fail(item() + ": bool value " + std::to_string(b) + " is not 0 or 1");
        out->v = b != 0;
        return Status::Ok();
      }
      case GgufType::kString: {
        std::string s;
        RILL_TRY(read_string(&s, item));
        out->v = std::move(s);
        return Status::Ok();
      }
      case GgufType::kArray:
        return read_array(key, depth, out);
    }
    return fail(item() + ": unknown value type");
  }

  template <typename Stored, typename Held>
  Status read_scalar(GgufValue* out, const std::string& key) {
    Stored x{};
    if (!read(&x)) return truncated("metadata '" + key + "'");
    out->v = static_cast<Held>(x);
    return Status::Ok();
  }

  Status read_array(const std::string& key, int depth, GgufValue* out) {
    if (depth >= kGgufMaxArrayDepth)
      return fail("metadata '" + key + "': arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth) +
                  " levels");
    uint32_t elem_type = 0;
    if (!read(&elem_type)) return truncated("the element type of metadata '" + key + "'");
    if (!valid_type(elem_type))
      return fail("metadata '" + key + "': unknown array element type " + std::to_string(elem_type));
    uint64_t count = 0;
    if (!read(&count)) return truncated("the length of metadata '" + key + "'");
    const auto et = static_cast<GgufType>(elem_type);
    if (count > remaining() / min_encoded_size(et))
      return fail("metadata '" + key + "': array length " + std::to_string(count) + " runs past the end of the file (" +
                  std::to_string(remaining()) + " bytes remain)");
    if (count > kGgufMaxArrayElements - n_array_elements_)
      return fail("metadata '" + key + "': arrays hold more than " + std::to_string(kGgufMaxArrayElements) +
                  " elements in total");
    n_array_elements_ += count;
    out->array_type = et;
    auto arr = std::make_shared<GgufArray>(count);
    for (auto& elem : *arr) RILL_TRY(read_value(et, key, depth + 1, &elem));
    out->v = std::move(arr);
    return Status::Ok();
  }

  Status read_alignment(GgufFile* f) {
    f->alignment_ = kDefaultAlignment;
    const GgufValue* v = f->find("general.alignment");
    if (!v) return Status::Ok();
    auto a = v->as_int();
    if (!a || v->type == GgufType::kBool) return fail("general.alignment must be an integer");
    if (*a <= 0 || (*a & (*a - 1)) != 0 || *a > (int64_t{1} << 30))
      return fail("general.alignment " + std::to_string(*a) + " is not a power of two between 1 and 2^30");
    f->alignment_ = static_cast<size_t>(*a);
    return Status::Ok();
  }

  Status read_tensor_info(GgufFile* f, uint64_t index) {
    GgufTensorInfo t;
    RILL_TRY(read_string(&t.name, [&] { return "the name of tensor #" + std::to_string(index); }));
    auto item = [&] { return "tensor '" + t.name + "'"; };
    uint32_t n_dims = 0;
    if (!read(&n_dims)) return truncated("the dimension count of " + item());
    if (n_dims < 1 || n_dims > static_cast<uint32_t>(kGgufMaxDims))
      return fail(item() + ": " + std::to_string(n_dims) + " dimensions (expected 1 to " +
                  std::to_string(kGgufMaxDims) + ")");
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t ne = 0;
      if (!read(&ne)) return truncated("the shape of " + item());
      if (ne < 0) return fail(item() + ": negative dimension " + std::to_string(ne));
      if (__builtin_mul_overflow(n_elements, ne, &n_elements)) return fail(item() + ": element count overflows");
      t.ne.push_back(ne);
    }
    if (!read(&t.type)) return truncated("the type of " + item());
    if (!read(&t.offset)) return truncated("the data offset of " + item());
    if (t.offset % f->alignment_ != 0)
      return fail(item() + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                  std::to_string(f->alignment_));
    if (auto info = dtype_info(t.type)) {
      if (t.ne[0] % info->block_size != 0)
        return fail(item() + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of " +
                    std::string(info->name) + "'s block size " + std::to_string(info->block_size));
      // Blocks and bytes are bounded by n_elements < 2^63, block_bytes <= 300 and
      // block_size >= 1, so only the byte count can overflow.
      const uint64_t n_blocks = static_cast<uint64_t>(n_elements / info->block_size);
      uint64_t n_bytes = 0;
      if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(info->block_bytes), &n_bytes) || n_bytes > SIZE_MAX)
        return fail(item() + ": data size overflows");
      t.n_bytes = static_cast<size_t>(n_bytes);
    }
    if (f->tensor_index_.count(t.name)) return fail("duplicate tensor name '" + t.name + "'");
    f->tensor_index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
    return Status::Ok();
  }

  Status check_tensor_data(GgufFile* f) {
    const uint64_t data_size = f->data_start_ <= size_ ? size_ - f->data_start_ : 0;
    for (auto& t : f->tensors_) {
      if (!dtype_info(t.type)) continue;  // unsupported: recorded without data
      if (t.offset > data_size || t.n_bytes > data_size - t.offset)
        return fail("tensor '" + t.name + "': data [offset " + std::to_string(t.offset) + ", " +
                    std::to_string(t.n_bytes) + " bytes] runs past the end of the file (" + std::to_string(size_) +
                    " bytes)");
      // A zero-byte tensor may sit at (or, with no data section, past) the end.
      t.data = data_ + std::min<uint64_t>(f->data_start_ + t.offset, size_);
    }
    return Status::Ok();
  }

  const uint8_t* data_;
  size_t size_;
  const std::string& name_;
  size_t pos_ = 0;
  uint64_t n_array_elements_ = 0;
};

Result<std::shared_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  GgufParser parser(data, size, name);
  RILL_TRY(parser.parse(f.get()));
  return f;
}

Result<std::shared_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  RILL_ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::open(path));
  RILL_ASSIGN_OR_RETURN(std::shared_ptr<GgufFile> f, parse(mapping.data(), mapping.size(), path));
  f->file_ = std::move(mapping);  // the mapping's address does not change on move
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->as_string()) return std::nullopt;
  return *v->as_string();
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_int() : std::nullopt;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_float() : std::nullopt;
}

const GgufArray* GgufFile::get_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_array() : nullptr;
}

}  // namespace rill
