#include "server/embeddings.h"

#include <cmath>
#include <cstring>
#include <mutex>

#include "server/api_handlers.h"
#include "server/field_reader.h"
#include "server/openai_common.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using ojson = nlohmann::ordered_json;

// Token ids of `ids` (an array), each an integer in [0, n_vocab).
std::variant<std::vector<int32_t>, ApiError> read_ids(const FieldReader& ids, int64_t n_vocab) {
  const ojson& a = ids.value();
  if (a.empty()) return ids.error("must not be empty");
  std::vector<int32_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::optional<int64_t> id = json_integer(a[i]);
    if (!id) return ids.at(i).type_error("an integer token id");
    if (*id < 0 || *id >= n_vocab)
      return ids.at(i).error("token id " + std::to_string(*id) + " is outside the vocabulary (" +
                             std::to_string(n_vocab) + " tokens)");
    out.push_back(static_cast<int32_t>(*id));
  }
  return out;
}

}  // namespace

std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(const EmbeddingLimits& limits,
                                                                   const ojson& body_json) {
  const FieldReader body(body_json);
  EmbeddingsRequest out;
  std::optional<std::string> model, format, user;
  if (auto e = body.read_string("model", model)) return *e;
  if (auto e = body.read_string("user", user)) return *e;
  out.model = model && !model->empty() ? *model : limits.model_id;

  const ojson* input = body.find("input");
  if (!input) return body.error("input", "field required");
  const FieldReader in = body.at("input");
  if (input->is_string()) {
    if (input->get_ref<const std::string&>().empty()) return in.error("must not be empty");
    out.inputs.emplace_back(input->get<std::string>());
  } else if (input->is_array()) {
    if (input->empty()) return in.error("must not be empty");
    if (input->size() > limits.max_inputs)
      return in.error("at most " + std::to_string(limits.max_inputs) + " inputs per request");
    const ojson& first = (*input)[0];
    if (first.is_number()) {  // one input as token ids
      auto ids = read_ids(in, limits.n_vocab);
      if (auto* e = std::get_if<ApiError>(&ids)) return *e;
      out.inputs.emplace_back(std::move(std::get<std::vector<int32_t>>(ids)));
    } else {
      for (size_t i = 0; i < input->size(); ++i) {
        const ojson& v = (*input)[i];
        const FieldReader item = in.at(i);
        if (first.is_string() && v.is_string()) {
          if (v.get_ref<const std::string&>().empty()) return item.error("must not be empty");
          out.inputs.emplace_back(v.get<std::string>());
        } else if (first.is_array() && v.is_array()) {
          auto ids = read_ids(item, limits.n_vocab);
          if (auto* e = std::get_if<ApiError>(&ids)) return *e;
          out.inputs.emplace_back(std::move(std::get<std::vector<int32_t>>(ids)));
        } else {
          return item.type_error(first.is_array() ? "a list of token ids (as input[0])" : "a string (as input[0])");
        }
      }
    }
  } else {
    return in.type_error("a string, a list of strings, a list of token ids or a list of token-id lists");
  }

  if (auto e = body.read_string("encoding_format", format)) return *e;
  if (format && *format != "float" && *format != "base64")
    return body.error("encoding_format", "must be \"float\" or \"base64\", not \"" + *format + "\"");
  out.base64 = format && *format == "base64";

  std::optional<int64_t> dims;
  if (auto e = body.read_int("dimensions", 1, INT32_MAX, dims)) return *e;
  out.dimensions = dims.value_or(limits.n_dims);
  if (out.dimensions != limits.n_dims) {
    if (!limits.truncatable)
      return body.error("dimensions", "this model's embeddings have " + std::to_string(limits.n_dims) +
                                          " dimensions and cannot be shortened (it declares no Matryoshka training)");
    if (out.dimensions > limits.n_dims)
      return body.error("dimensions", "must be at most " + std::to_string(limits.n_dims));
  }
  return out;
}

std::string base64_encode(const void* data, size_t n) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out += kAlphabet[(b >> 18) & 63];
    out += kAlphabet[(b >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(b >> 6) & 63] : '=';
    out += i + 2 < n ? kAlphabet[b & 63] : '=';
  }
  return out;
}

namespace {

// One request's inputs in flight: each engine request's last event lands
// here (the engine's event dispatcher thread); the last one sends the reply.
struct EmbeddingsCall {
  ServerContext& ctx;
  std::shared_ptr<Responder> res;
  EmbeddingsRequest request;
  EmbeddingSpec spec;
  std::mutex mu;  // guards below
  std::vector<std::vector<float>> vectors;
  std::vector<uint64_t> ids;  // engine request ids, for cancellation
  int64_t prompt_tokens = 0;
  size_t n_done = 0;
  bool closed = false;

  EmbeddingsCall(ServerContext& c, std::shared_ptr<Responder> r, EmbeddingsRequest q, EmbeddingSpec s)
      : ctx(c), res(std::move(r)), request(std::move(q)), spec(s), vectors(request.inputs.size()) {}

  void cancel_all() {
    for (uint64_t id : ids) ctx.engine.cancel(id);
  }

  void on_done(size_t index, GenerationEvent&& ev) {
    std::lock_guard lk(mu);
    if (closed) return;
    if (ev.finish_reason == FinishReason::kError || ev.finish_reason == FinishReason::kAborted ||
        ev.embedding.empty()) {
      closed = true;
      cancel_all();
      const std::string why = ev.error.empty() ? "the request was aborted" : ev.error;
      send_error(*res, ApiError(500, "input[" + std::to_string(index) + "]: " + why, "server_error"));
      return;
    }
    vectors[index] = std::move(ev.embedding);
    prompt_tokens += ev.usage.prompt_tokens;
    if (++n_done == vectors.size()) reply();
  }

  // Truncation (dimensions below the model's) renormalizes, as the
  // Matryoshka models' reference does.
  void reply() {
    closed = true;
    ojson data = ojson::array();
    for (size_t i = 0; i < vectors.size(); ++i) {
      std::vector<float>& v = vectors[i];
      if (static_cast<int64_t>(v.size()) > request.dimensions) {
        v.resize(static_cast<size_t>(request.dimensions));
        if (spec.normalize) {
          double sq = 0;
          for (float x : v) sq += double(x) * x;
          const double norm = std::max(std::sqrt(sq), 1e-12);
          for (float& x : v) x = static_cast<float>(x / norm);
        }
      }
      ojson item = {{"object", "embedding"}, {"index", i}};
      if (request.base64) {
        item["embedding"] = base64_encode(v.data(), v.size() * sizeof(float));  // x86-64: little-endian
      } else {
        item["embedding"] = v;
      }
      data.push_back(std::move(item));
    }
    ojson body = {{"object", "list"},
                  {"data", std::move(data)},
                  {"model", request.model},
                  {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
    res->send(200, "application/json", openai::json_text(body), {});
  }
};

}  // namespace

void handle_embeddings(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  const Model& model = ctx.engine.model();
  const EmbeddingSpec spec = model.embedding();
  if (spec.pooling == EmbeddingSpec::Pooling::kNone) {
    return send_error(*res, ApiError(400,
                                     "model: '" + ctx.options.model_id +
                                         "' declares no pooling (no sentence-transformers Pooling module or GGUF "
                                         "pooling_type), so it computes no embeddings; serve an embedding model",
                                     "invalid_request_error", "model", "model_not_supported"));
  }
  EmbeddingLimits limits;
  limits.model_id = ctx.options.model_id;
  limits.n_vocab = model.n_vocab();
  limits.n_dims = spec.n_dims;
  limits.truncatable = spec.truncatable;
  auto request = parse_embeddings_request(limits, std::get<ojson>(parsed));
  if (auto* e = std::get_if<ApiError>(&request)) return send_error(*res, *e);
  EmbeddingsRequest& q = std::get<EmbeddingsRequest>(request);

  // Every input tokenized and checked before anything is submitted.
  const Tokenizer* tok = ctx.engine.tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const std::string field = q.inputs.size() == 1 && std::holds_alternative<std::string>(q.inputs[i])
                                  ? "input"
                                  : "input[" + std::to_string(i) + "]";
    if (const auto* text = std::get_if<std::string>(&q.inputs[i])) {
      if (!tok) return send_error(*res, ApiError(400, field + ": this model has no tokenizer; send token ids"));
      // Special tokens written in the text are parsed, as Hugging Face's tokenizer does.
      prompts.push_back(tok->encode(*text, /*add_special=*/true, /*parse_special=*/true));
    } else {
      prompts.push_back(std::get<std::vector<int32_t>>(q.inputs[i]));
    }
    if (static_cast<int64_t>(prompts.back().size()) > model.n_ctx()) {
      return send_error(
          *res, ApiError(400,
                         field + ": " + std::to_string(prompts.back().size()) +
                             " tokens exceed the model's maximum input of " + std::to_string(model.n_ctx()) + " tokens",
                         "invalid_request_error", field, "context_length_exceeded"));
    }
  }

  auto call = std::make_shared<EmbeddingsCall>(ctx, res, std::move(q), spec);
  {
    std::lock_guard lk(call->mu);  // on_done waits until every input is submitted
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest g;
      g.prompt = std::move(prompts[i]);
      g.embed = true;
      auto id = ctx.engine.submit(std::move(g), [call, i](GenerationEvent&& ev) {
        if (ev.finished) call->on_done(i, std::move(ev));
      });
      if (!id.ok()) {
        call->closed = true;
        call->cancel_all();
        return send_error(*res, ApiError(400, id.error().message, "invalid_request_error", "input"));
      }
      call->ids.push_back(*id);
    }
  }
  res->on_disconnect([call] {
    std::lock_guard lk2(call->mu);
    if (call->closed) return;
    call->closed = true;
    call->cancel_all();
  });
}

}  // namespace rill::server
