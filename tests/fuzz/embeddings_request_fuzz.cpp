// Fuzz target for the /v1/embeddings request reader: parse_body
// (parse_json), then parse_embeddings_request with plain limits (no model
// needed). Input: the request body.
// Checks: parse_json agrees with nlohmann (request_fuzz_util.h); errors are
// 400s naming their field; an accepted request has 1..max_inputs non-empty
// inputs, token ids inside the vocabulary and a width the model allows.
#include <cstdint>
#include <string>

#include "request_fuzz_util.h"
#include "server/embeddings.h"
#include "server/openai_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rill::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  rill::fuzz::check_parse_json(text);
  auto body = openai::parse_body(text);
  if (auto* e = std::get_if<ApiError>(&body)) {
    rill::fuzz::check_request_error(*e);
    return 0;
  }
  for (bool truncatable : {false, true}) {
    EmbeddingLimits limits;
    limits.model_id = "fuzz";
    limits.n_vocab = 1000;
    limits.n_dims = 384;
    limits.truncatable = truncatable;
    limits.max_inputs = 16;
    auto request = parse_embeddings_request(limits, std::get<openai::ojson>(body));
    if (auto* e = std::get_if<ApiError>(&request)) {
      rill::fuzz::check_request_error(*e);
      continue;
    }
    const auto& r = std::get<EmbeddingsRequest>(request);
    FUZZ_CHECK(!r.inputs.empty() && r.inputs.size() <= limits.max_inputs);
    for (const auto& in : r.inputs) {
      if (const auto* s = std::get_if<std::string>(&in)) {
        FUZZ_CHECK(!s->empty());
      } else {
        const auto& ids = std::get<std::vector<int32_t>>(in);
        FUZZ_CHECK(!ids.empty());
        for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < limits.n_vocab);
      }
    }
    FUZZ_CHECK(r.dimensions >= 1 && r.dimensions <= limits.n_dims);
    FUZZ_CHECK(truncatable || r.dimensions == limits.n_dims);
    const float v[3] = {1.0f, -2.5f, 0.0f};
    FUZZ_CHECK(base64_encode(v, sizeof v).size() == 16);
  }
  return 0;
}
