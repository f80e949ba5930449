#include "server/field_reader.h"

#include <cassert>
#include <cmath>
#include <cstdint>

#include "core/json_parse.h"

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

// Shortest round-trip form, without a trailing ".0": 0, 2, 0.5, 1e-09.
std::string number_text(double x) {
  std::string s = nlohmann::json(x).dump();
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

std::string int_range_text(int64_t lo, int64_t hi) {
  if (hi == INT64_MAX || hi == INT32_MAX) return "must be at least " + std::to_string(lo);
  if (lo == INT64_MIN || lo == INT32_MIN) return "must be at most " + std::to_string(hi);
  return "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

}  // namespace

const char* json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

ApiError field_error(const std::string& path, const std::string& message) {
  return ApiError(400, path.empty() ? message : path + ": " + message, "invalid_request_error", path);
}

std::optional<int64_t> json_integer(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double x = v.get<double>();
    // 2^63 is exactly representable; every double in [-2^63, 2^63) fits int64.
    if (std::floor(x) == x && x >= -9223372036854775808.0 && x < 9223372036854775808.0) return int64_t(x);
  }
  return std::nullopt;
}

std::string FieldReader::path_of(std::string_view key) const {
  return json_path_key(path_, key);
}
std::string FieldReader::path_of(size_t index) const {
  return json_path_index(path_, index);
}

const Json* FieldReader::find(std::string_view key) const {
  if (!value_->is_object()) return nullptr;
  auto it = value_->find(key);
  return it == value_->end() || it->is_null() ? nullptr : &*it;
}

FieldReader FieldReader::at(std::string_view key) const {
  const Json* v = find(key);
  assert(v != nullptr);
  return FieldReader(*v, path_of(key));
}

FieldReader FieldReader::at(size_t index) const {
  assert(value_->is_array() && index < value_->size());
  return FieldReader((*value_)[index], path_of(index));
}

ApiError FieldReader::type_error(const char* what) const {
  return error(std::string("expected ") + what + ", got " + json_type_name(*value_));
}

ApiError FieldReader::type_error(std::string_view key, const char* what) const {
  const Json* v = find(key);
  return error(key, std::string("expected ") + what + ", got " + (v == nullptr ? "null" : json_type_name(*v)));
}

FieldReader::Check FieldReader::read_bool(std::string_view key, std::optional<bool>& out) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return type_error(key, "a boolean");
  out = v->get<bool>();
  return std::nullopt;
}

FieldReader::Check FieldReader::read_string(std::string_view key, std::optional<std::string>& out) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return type_error(key, "a string");
  out = v->get<std::string>();
  return std::nullopt;
}

FieldReader::Check FieldReader::require_string(std::string_view key, std::string& out) const {
  if (find(key) == nullptr) return error(key, "field required");
  std::optional<std::string> s;
  if (auto e = read_string(key, s)) return e;
  out = std::move(*s);
  return std::nullopt;
}

FieldReader::Check FieldReader::read_number(std::string_view key, NumberRange r, std::optional<float>& out) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return type_error(key, "a number");
  const double x = v->get<double>();
  if (!(r.lo_open ? x > r.lo : x >= r.lo) || !(x <= r.hi)) {
    return error(
        key, "must be in " + std::string(r.lo_open ? "(" : "[") + number_text(r.lo) + ", " + number_text(r.hi) + "]");
  }
  out = static_cast<float>(x);
  return std::nullopt;
}

FieldReader::Check FieldReader::as_int(int64_t lo, int64_t hi, int64_t& out) const {
  const std::optional<int64_t> x = json_integer(*value_);
  if (!x) {
    // Integral but beyond int64: a range error, not a type error.
    const bool huge = value_->is_number_unsigned() ||
                      (value_->is_number_float() && std::floor(value_->get<double>()) == value_->get<double>());
    if (huge) return error(int_range_text(lo, hi));
    return type_error("an integer");
  }
  if (*x < lo || *x > hi) return error(int_range_text(lo, hi));
  out = *x;
  return std::nullopt;
}

FieldReader::Check FieldReader::read_int(std::string_view key, int64_t lo, int64_t hi,
                                         std::optional<int64_t>& out) const {
  if (find(key) == nullptr) return std::nullopt;
  int64_t x = 0;
  if (auto e = at(key).as_int(lo, hi, x)) return e;
  out = x;
  return std::nullopt;
}

FieldReader::Check FieldReader::require_int(std::string_view key, int64_t lo, int64_t hi, int64_t& out) const {
  if (find(key) == nullptr) return error(key, "field required");
  return at(key).as_int(lo, hi, out);
}

FieldReader::Check FieldReader::read_object(std::string_view key, std::optional<FieldReader>& out) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return type_error(key, "an object");
  out.emplace(*v, path_of(key));
  return std::nullopt;
}

FieldReader::Check FieldReader::read_array(std::string_view key, std::optional<FieldReader>& out) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return type_error(key, "an array");
  out.emplace(*v, path_of(key));
  return std::nullopt;
}

}  // namespace rill::server
