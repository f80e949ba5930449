#include "engine/replay_speculator.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace rill {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

ReplaySpeculator::ReplaySpeculator(std::vector<std::vector<int32_t>> sequences, double acceptance)
    : sequences_(std::move(sequences)) {
  const double a = std::clamp(acceptance, 0.0, 1.0);
  // a == 1 keeps every draft (the threshold is above every hash).
  keep_threshold_ = a >= 1.0 ? UINT64_MAX : static_cast<uint64_t>(std::ldexp(a, 64));
}

const std::vector<int32_t>* ReplaySpeculator::match(std::span<const int32_t> tokens) const {
  // A linear scan: a benchmark records tens to hundreds of sequences, and
  // the first token differs between most of them, so a row costs a few
  // comparisons plus one full prefix check.
  for (const auto& s : sequences_) {
    if (s.size() <= tokens.size() || s.front() != tokens.front()) continue;
    if (std::equal(tokens.begin(), tokens.end(), s.begin())) return &s;
  }
  return nullptr;
}

void ReplaySpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                               std::vector<int32_t>& out) {
  (void)seq;  // matched by its tokens: a request id differs between the recording run and this one
  assert(max_tokens >= 1);
  if (tokens.empty()) return;
  const std::vector<int32_t>* s = match(tokens);
  if (s == nullptr) return;
  const size_t from = tokens.size();
  const size_t end = std::min(s->size(), from + static_cast<size_t>(max_tokens));
  const auto seq_index = static_cast<uint64_t>(s - sequences_.data());
  for (size_t i = from; i < end; ++i) {
    int32_t t = (*s)[i];
    if (keep_threshold_ != UINT64_MAX && splitmix64(seq_index << 32 ^ i) >= keep_threshold_) {
      t = t == 0 ? 1 : t - 1;  // any other id: the target never took it here
    }
    out.push_back(t);
  }
}

Result<std::unique_ptr<Speculator>> make_replay_speculator(const std::string& arg) {
  std::string path = arg;
  double acceptance = 1.0;
  if (const size_t colon = arg.rfind(':'); colon != std::string::npos) {
    const std::string a = arg.substr(colon + 1);
    char* end = nullptr;
    acceptance = std::strtod(a.c_str(), &end);
    if (a.empty() || end != a.c_str() + a.size() || !(acceptance >= 0.0 && acceptance <= 1.0)) {
      return Error{"--spec replay=" + arg + ": the acceptance after ':' must be a number in [0, 1]"};
    }
    path = arg.substr(0, colon);
  }
  std::ifstream in(path);
  if (!in) return Error{path + ": cannot open the replay file (--spec replay=FILE[:ACCEPTANCE])"};
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("sequences") || !j["sequences"].is_array()) {
    return Error{path + ": not a replay file (expected JSON {\"sequences\": [[token ids], ...]})"};
  }
  std::vector<std::vector<int32_t>> sequences;
  for (const auto& s : j["sequences"]) {
    if (!s.is_array() || s.empty()) return Error{path + ": every sequence must be a non-empty list of token ids"};
    std::vector<int32_t>& ids = sequences.emplace_back();
    for (const auto& t : s) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
        return Error{path + ": token ids must be non-negative integers"};
      }
      ids.push_back(t.get<int32_t>());
    }
  }
  return std::unique_ptr<Speculator>(std::make_unique<ReplaySpeculator>(std::move(sequences), acceptance));
}

Status write_replay_file(const std::string& path, const std::vector<std::vector<int32_t>>& sequences) {
  std::ofstream out(path);
  if (!out) return Error{path + ": cannot write the replay file"};
  out << nlohmann::json{{"sequences", sequences}}.dump() << '\n';
  if (!out) return Error{path + ": write failed"};
  return Status::Ok();
}

}  // namespace rill
