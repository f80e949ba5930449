#include "server/openai_common.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <random>

#include "core/json_parse.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/sse.h"
#include "text/tokenizer.h"

namespace rill::server::openai {
namespace {

std::optional<ApiError> read_stop(const FieldReader& body, std::vector<std::string>& out) {
  const ojson* v = body.find("stop");
  if (v == nullptr) return std::nullopt;
  constexpr size_t kMaxStops = 16;
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) out.push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return body.type_error("stop", "a string or an array of strings");
  if (v->size() > kMaxStops) return body.error("stop", "at most " + std::to_string(kMaxStops) + " stop strings");
  const FieldReader stops = body.at("stop");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return stops.at(i).type_error("a string");
    if (!(*v)[i].get_ref<const std::string&>().empty()) out.push_back((*v)[i].get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> read_logit_bias(const RequestLimits& limits, const FieldReader& body,
                                        std::vector<std::pair<int32_t, float>>& out) {
  std::optional<FieldReader> bias;
  if (auto e = body.read_object("logit_bias", bias)) return e;
  if (!bias) return std::nullopt;
  const int64_t n_vocab = limits.n_vocab;
  const ojson& v = bias->value();
  // One entry per token id: "1" and "01" name the same token (the last wins).
  std::vector<int32_t> slot_of;  // id -> position in out + 1, sized on first use
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= n_vocab) {
      return body.error("logit_bias",
                        "'" + key + "' is not a token id of this model (0.." + std::to_string(n_vocab - 1) + ")");
    }
    if (!it.value().is_number()) return body.error("logit_bias", "the bias of token " + key + " must be a number");
    const double b = it.value().get<double>();
    if (!(b >= -100.0 && b <= 100.0)) {
      return body.error("logit_bias", "the bias of token " + key + " must be in [-100, 100]");
    }
    if (slot_of.empty()) slot_of.assign(size_t(n_vocab), 0);
    int32_t& slot = slot_of[size_t(id)];
    if (slot > 0) {
      out[size_t(slot - 1)].second = static_cast<float>(b);
    } else {
      out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
      slot = static_cast<int32_t>(out.size());
    }
  }
  return std::nullopt;
}

ojson token_bytes(const std::string& piece) {
  ojson bytes = ojson::array();
  for (unsigned char c : piece) bytes.push_back(int(c));
  return bytes;
}

double shown_logprob(float lp) {
  return std::isfinite(lp) ? double(lp) : -9999.0;
}

}  // namespace

std::variant<ojson, ApiError> parse_body(const std::string& body) {
  auto parsed = parse_json(body);
  if (auto* e = std::get_if<JsonParseError>(&parsed)) {
    if (e->kind == JsonParseError::Kind::kTooDeep) return field_error(e->path, e->message);
    return ApiError(400, "the request body is " + e->message);
  }
  ojson& j = std::get<ojson>(parsed);
  if (!j.is_object()) {
    return ApiError(400, std::string("the request body must be a JSON object, got ") + json_type_name(j));
  }
  return std::move(j);
}

RequestLimits request_limits(const ServerContext& ctx) {
  RequestLimits l;
  l.model_id = ctx.options.model_id;
  l.max_n = ctx.options.max_n;
  l.max_tokens_cap = ctx.options.max_tokens_cap;
  l.n_vocab = ctx.engine.model().n_vocab();
  return l;
}

std::optional<ApiError> read_common(const RequestLimits& limits, const FieldReader& body, CommonFields& out) {
#define RILL_READ(expr) \
  if (auto e = (expr)) return e
  std::optional<std::string> model;
  RILL_READ(body.read_string("model", model));
  out.model = model && !model->empty() ? *model : limits.model_id;
  std::optional<bool> stream, ignore_eos;
  RILL_READ(body.read_bool("stream", stream));
  out.stream = stream.value_or(false);
  std::optional<FieldReader> so;
  RILL_READ(body.read_object("stream_options", so));
  if (so) {
    std::optional<bool> include_usage;
    RILL_READ(so->read_bool("include_usage", include_usage));
    out.include_usage = include_usage.value_or(false);
  }
  std::optional<int64_t> n, top_k, seed, max_tokens, max_completion_tokens;
  RILL_READ(body.read_int("n", 1, limits.max_n, n));
  out.n = static_cast<int>(n.value_or(1));
  SamplingOverrides& s = out.sampling;
  RILL_READ(body.read_number("temperature", {0.0, 2.0}, s.temperature));  // OpenAI's range
  RILL_READ(body.read_number("top_p", {0.0, 1.0}, s.top_p));              // 0: greedy (resolve_sampling)
  RILL_READ(body.read_number("min_p", {0.0, 1.0}, s.min_p));
  RILL_READ(body.read_number("presence_penalty", {-2.0, 2.0}, s.presence_penalty));
  RILL_READ(body.read_number("frequency_penalty", {-2.0, 2.0}, s.frequency_penalty));
  RILL_READ(body.read_number("repetition_penalty", {0.0, 100.0, /*lo_open=*/true}, s.repetition_penalty));
  RILL_READ(body.read_int("top_k", -1, INT32_MAX, top_k));
  if (top_k) s.top_k = static_cast<int>(std::max<int64_t>(*top_k, 0));  // -1: off (vLLM)
  RILL_READ(body.read_int("seed", INT64_MIN, INT64_MAX, seed));
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  const int64_t min_tokens = limits.allow_zero_max_tokens ? 0 : 1;
  RILL_READ(body.read_int("max_tokens", min_tokens, INT32_MAX, max_tokens));
  RILL_READ(body.read_int("max_completion_tokens", min_tokens, INT32_MAX, max_completion_tokens));
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  const int32_t cap = limits.max_tokens_cap;
  if (max_tokens && cap > 0 && *max_tokens > cap) {
    return body.error(max_completion_tokens ? "max_completion_tokens" : "max_tokens",
                      "must be at most " + std::to_string(cap) + " on this server");
  }
  out.generation.max_tokens = static_cast<int32_t>(max_tokens.value_or(0));
  out.generation.prompt_only = max_tokens && *max_tokens == 0;
  RILL_READ(read_stop(body, out.generation.stop));
  RILL_READ(read_logit_bias(limits, body, out.logit_bias));
  RILL_READ(body.read_bool("ignore_eos", ignore_eos));
  out.generation.ignore_eos = ignore_eos.value_or(false);
  std::optional<bool> speculative;  // rill: false opts out of the server's speculative decoding
  RILL_READ(body.read_bool("speculative", speculative));
  out.generation.speculative = speculative.value_or(true);
#undef RILL_READ
  return std::nullopt;
}

GenerationRequest choice_request(const ServerContext& ctx, const CommonFields& f, int index) {
  GenerationRequest g = f.generation;
  SamplingOverrides s = f.sampling;
  if (s.seed) *s.seed += static_cast<uint64_t>(index);
  g.sampling = resolve_sampling(ctx, s);
  g.sampling.logit_bias = f.logit_bias;
  return g;
}

std::string new_id(const char* prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string json_text(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::span<const SampledToken> shown_logprobs(const GenerationEvent& event) {
  std::span<const SampledToken> s(event.logprobs);
  if (event.finished && event.stop_token && !s.empty()) s = s.first(s.size() - 1);
  return s;
}

std::span<const SampledToken> shown_logprobs(const ChatResult& result) {
  std::span<const SampledToken> s(result.logprobs);
  if (result.stop_token && !s.empty()) s = s.first(s.size() - 1);
  return s;
}

ojson chat_logprobs(const Tokenizer& tok, std::span<const SampledToken> entries) {
  ojson content = ojson::array();
  for (const SampledToken& t : entries) {
    const std::string piece = tok.token_to_piece(t.id);
    ojson top = ojson::array();
    for (int k = 0; k < t.n_top; ++k) {
      const std::string p = tok.token_to_piece(t.top[k].id);
      top.push_back({{"token", p}, {"logprob", shown_logprob(t.top[k].logprob)}, {"bytes", token_bytes(p)}});
    }
    content.push_back({{"token", piece},
                       {"logprob", shown_logprob(t.logprob)},
                       {"bytes", token_bytes(piece)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

ojson empty_completion_logprobs() {
  return {{"tokens", ojson::array()},
          {"token_logprobs", ojson::array()},
          {"top_logprobs", ojson::array()},
          {"text_offset", ojson::array()}};
}

void append_completion_logprobs(const Tokenizer& tok, std::span<const SampledToken> entries, ojson& out,
                                size_t& offset) {
  for (const SampledToken& t : entries) {
    const std::string piece = tok.token_to_piece(t.id);
    out["tokens"].push_back(piece);
    out["token_logprobs"].push_back(shown_logprob(t.logprob));
    ojson top = ojson::object();
    for (int k = 0; k < t.n_top; ++k) top[tok.token_to_piece(t.top[k].id)] = shown_logprob(t.top[k].logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += piece.size();
  }
}

void append_prompt_logprobs(const Tokenizer& tok, std::span<const int32_t> prompt, std::span<const SampledToken> scores,
                            ojson& out, size_t& offset) {
  if (prompt.empty()) return;
  const std::string first = tok.token_to_piece(prompt[0]);
  out["tokens"].push_back(first);
  out["token_logprobs"].push_back(nullptr);
  out["top_logprobs"].push_back(nullptr);
  out["text_offset"].push_back(offset);
  offset += first.size();
  append_completion_logprobs(tok, scores, out, offset);
}

ojson usage_json(const std::vector<ChatResult>& results, size_t per_prompt) {
  int64_t prompt = 0, cached = 0, completion = 0, reasoning = 0, drafted = 0, accepted = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (per_prompt > 0 && i % per_prompt == 0) {
      prompt += results[i].usage.prompt_tokens;
      cached += results[i].usage.cached_tokens;
    }
    completion += results[i].usage.completion_tokens;
    reasoning += results[i].usage.reasoning_tokens;
    drafted += results[i].usage.draft_tokens;
    accepted += results[i].usage.accepted_draft_tokens;
  }
  // Speculative decoding's drafts, in the fields OpenAI's Predicted Outputs
  // use for the same thing: drafts that held and drafts that did not.
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}},
          {"completion_tokens_details",
           {{"reasoning_tokens", reasoning},
            {"accepted_prediction_tokens", accepted},
            {"rejected_prediction_tokens", drafted - accepted}}}};
}

OpenAiCall::OpenAiCall(ServerContext& ctx, std::shared_ptr<Responder> res, bool stream, std::string id)
    : ctx_(ctx), stream_(stream), id_(std::move(id)), created_(unix_time()), res_(std::move(res)) {}

ojson OpenAiCall::envelope(const char* object, const std::string& model, ojson choices) const {
  return {{"id", id_},
          {"object", object},
          {"created", created_},
          {"model", model},
          {"system_fingerprint", kSystemFingerprint},
          {"choices", std::move(choices)}};
}

void OpenAiCall::run(std::vector<Job> jobs) {
  std::weak_ptr<OpenAiCall> weak = shared_from_this();
  {
    std::lock_guard lk(mu_);
    results_.resize(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      ChatCallbacks callbacks;
      auto self = shared_from_this();
      callbacks.on_delta = [self, i](const OutputDelta& d, const GenerationEvent& ev) { self->on_delta(i, d, ev); };
      callbacks.on_done = [self, i](const ChatResult& r) { self->on_done(i, r); };
      auto started = ChatStream::start(ctx_, *jobs[i].prompt, std::move(jobs[i].generation), std::move(callbacks));
      if (auto* e = std::get_if<ApiError>(&started)) {
        closed_ = true;
        cancel_all();
        send_error(*res_, *e);
        return;
      }
      streams_.push_back(std::get<std::shared_ptr<ChatStream>>(std::move(started)));
    }
    if (stream_ && !closed_) {
      res_->start_stream("text/event-stream", {{"Cache-Control", "no-cache"}});
      if (ctx_.metrics != nullptr) ctx_.metrics->stream_opened();
      std::string frames = open_frames();
      if (!frames.empty()) res_->write(std::move(frames));
    }
  }
  res_->on_disconnect([weak] {
    if (auto self = weak.lock()) {
      std::lock_guard lk(self->mu_);
      self->cancel_all();
    }
  });
}

void OpenAiCall::cancel_all() {
  for (auto& s : streams_) s->cancel();
}

void OpenAiCall::on_delta(size_t index, const OutputDelta& delta, const GenerationEvent& event) {
  std::lock_guard lk(mu_);
  if (closed_ || !stream_) return;
  std::string frames = delta_frames(index, delta, event);
  if (!frames.empty()) res_->write(std::move(frames));
}

void OpenAiCall::on_done(size_t index, const ChatResult& result) {
  std::lock_guard lk(mu_);
  if (closed_) return;
  results_[index] = result;
  ++n_done_;
  if (result.finish_reason == "error") {
    closed_ = true;
    cancel_all();
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.code = "server_error";
    e.message = result.error.empty() ? "the generation failed" : result.error;
    if (stream_) {
      res_->write(sse_data(json_text(openai_error_body(e))));
      res_->write(sse_data("[DONE]"));
      // Closed first: the context may be gone once the reply has ended.
      if (ctx_.metrics != nullptr) ctx_.metrics->stream_closed();
      res_->end();
    } else {
      send_error(*res_, e);
    }
    return;
  }
  if (stream_) {
    std::string frames = finish_frames(index, result);
    if (!frames.empty()) res_->write(std::move(frames));
  }
  if (n_done_ < results_.size()) return;
  closed_ = true;
  streams_.clear();
  if (stream_) {
    std::string frames = close_frames(results_);
    frames += sse_data("[DONE]");
    res_->write(std::move(frames));
    // Closed first: the context may be gone once the reply has ended.
    if (ctx_.metrics != nullptr) ctx_.metrics->stream_closed();
    res_->end();
    return;
  }
  for (const ChatResult& r : results_) {
    if (r.finish_reason == "abort") {
      ApiError e;
      e.status = 503;
      e.type = "server_error";
      e.message = r.error.empty() ? "the request was cancelled" : r.error;
      send_error(*res_, e);
      return;
    }
  }
  res_->send(200, "application/json", json_text(response(results_)));
}

}  // namespace rill::server::openai
