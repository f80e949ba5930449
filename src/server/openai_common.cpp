#include "server/openai_common.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <random>

#include "model/model.h"
#include "server/metrics.h"
#include "server/sse.h"
#include "text/tokenizer.h"

namespace rill::server::openai {
namespace {

const char* type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "a boolean";
    case ojson::value_t::string: return "a string";
    case ojson::value_t::array: return "an array";
    case ojson::value_t::object: return "an object";
    default: return "a number";
  }
}

const ojson* find(const ojson& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string fmt_number(double x) {
  nlohmann::json j = x;
  return j.dump();
}

std::optional<ApiError> read_stop(const ojson& body, std::vector<std::string>& out) {
  const ojson* v = find(body, "stop");
  if (v == nullptr) return std::nullopt;
  constexpr size_t kMaxStops = 16;
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) out.push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return bad_field("stop", std::string("expected a string or an array of strings, got ") + type_name(*v));
  if (v->size() > kMaxStops) return bad_field("stop", "at most " + std::to_string(kMaxStops) + " stop strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return bad_field("stop[" + std::to_string(i) + "]", "expected a string");
    if (!(*v)[i].get_ref<const std::string&>().empty()) out.push_back((*v)[i].get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> read_logit_bias(const ServerContext& ctx, const ojson& body,
                                        std::vector<std::pair<int32_t, float>>& out) {
  const ojson* v = find(body, "logit_bias");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return bad_field("logit_bias", std::string("expected an object, got ") + type_name(*v));
  const int64_t n_vocab = ctx.engine.model().n_vocab();
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= n_vocab) {
      return bad_field("logit_bias", "'" + key + "' is not a token id of this model (0.." +
                                         std::to_string(n_vocab - 1) + ")");
    }
    if (!it.value().is_number()) return bad_field("logit_bias", "the bias of token " + key + " must be a number");
    const double bias = it.value().get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return bad_field("logit_bias", "the bias of token " + key + " must be in [-100, 100]");
    }
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

ojson token_bytes(const std::string& piece) {
  ojson bytes = ojson::array();
  for (unsigned char c : piece) bytes.push_back(int(c));
  return bytes;
}

double shown_logprob(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }

}  // namespace

ApiError bad_field(const std::string& param, const std::string& message) {
  ApiError e;
  e.status = 400;
  e.message = param + ": " + message;
  e.param = param;
  return e;
}

std::variant<ojson, ApiError> parse_body(const std::string& body) {
  ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ApiError e;
    e.message = "the request body is not valid JSON";
    return e;
  }
  if (!j.is_object()) {
    ApiError e;
    e.message = std::string("the request body must be a JSON object, got ") + type_name(j);
    return e;
  }
  return j;
}

std::optional<ApiError> read_bool(const ojson& body, const char* key, std::optional<bool>& out) {
  const ojson* v = find(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return bad_field(key, std::string("expected a boolean, got ") + type_name(*v));
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_number(const ojson& body, const char* key, double lo, double hi,
                                    std::optional<float>& out) {
  const ojson* v = find(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return bad_field(key, std::string("expected a number, got ") + type_name(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) return bad_field(key, "must be in [" + fmt_number(lo) + ", " + fmt_number(hi) + "]");
  out = static_cast<float>(x);
  return std::nullopt;
}

std::optional<ApiError> read_int(const ojson& body, const char* key, int64_t lo, int64_t hi,
                                 std::optional<int64_t>& out) {
  const ojson* v = find(body, key);
  if (v == nullptr) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      return bad_field(key, "must be at most " + std::to_string(hi));
    }
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());  // 5.0 is an integer in JSON Schema
  } else {
    return bad_field(key, std::string("expected an integer, got ") + type_name(*v));
  }
  if (x < lo || x > hi) {
    return bad_field(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  out = x;
  return std::nullopt;
}

std::optional<ApiError> read_string(const ojson& body, const char* key, std::optional<std::string>& out) {
  const ojson* v = find(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return bad_field(key, std::string("expected a string, got ") + type_name(*v));
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> read_common(const ServerContext& ctx, const ojson& body, CommonFields& out) {
#define RILL_READ(expr) \
  if (auto e = (expr)) return e
  std::optional<std::string> model;
  RILL_READ(read_string(body, "model", model));
  out.model = model && !model->empty() ? *model : ctx.options.model_id;
  std::optional<bool> stream, ignore_eos;
  RILL_READ(read_bool(body, "stream", stream));
  out.stream = stream.value_or(false);
  if (const ojson* so = find(body, "stream_options")) {
    if (!so->is_object()) return bad_field("stream_options", std::string("expected an object, got ") + type_name(*so));
    std::optional<bool> include_usage;
    if (auto e = read_bool(*so, "include_usage", include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "stream_options." + e->message;
      return e;
    }
    out.include_usage = include_usage.value_or(false);
  }
  std::optional<int64_t> n, top_k, seed, max_tokens, max_completion_tokens;
  RILL_READ(read_int(body, "n", 1, ctx.options.max_n, n));
  out.n = static_cast<int>(n.value_or(1));
  SamplingOverrides& s = out.sampling;
  RILL_READ(read_number(body, "temperature", 0.0, 100.0, s.temperature));
  RILL_READ(read_number(body, "top_p", 1e-9, 1.0, s.top_p));
  RILL_READ(read_number(body, "min_p", 0.0, 1.0, s.min_p));
  RILL_READ(read_number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  RILL_READ(read_number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  RILL_READ(read_number(body, "repetition_penalty", 1e-6, 100.0, s.repetition_penalty));
  RILL_READ(read_int(body, "top_k", -1, INT32_MAX, top_k));
  if (top_k) s.top_k = static_cast<int>(std::max<int64_t>(*top_k, 0));  // -1: off (vLLM)
  RILL_READ(read_int(body, "seed", INT64_MIN, INT64_MAX, seed));
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  RILL_READ(read_int(body, "max_tokens", 1, INT32_MAX, max_tokens));
  RILL_READ(read_int(body, "max_completion_tokens", 1, INT32_MAX, max_completion_tokens));
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  const int32_t cap = ctx.options.max_tokens_cap;
  if (max_tokens && cap > 0 && *max_tokens > cap) {
    return bad_field(max_completion_tokens ? "max_completion_tokens" : "max_tokens",
                     "must be at most " + std::to_string(cap) + " on this server");
  }
  out.generation.max_tokens = static_cast<int32_t>(max_tokens.value_or(0));
  RILL_READ(read_stop(body, out.generation.stop));
  RILL_READ(read_logit_bias(ctx, body, out.logit_bias));
  RILL_READ(read_bool(body, "ignore_eos", ignore_eos));
  out.generation.ignore_eos = ignore_eos.value_or(false);
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

std::string json_text(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

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

ojson usage_json(const std::vector<ChatResult>& results, size_t per_prompt) {
  int64_t prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (per_prompt > 0 && i % per_prompt == 0) {
      prompt += results[i].usage.prompt_tokens;
      cached += results[i].usage.cached_tokens;
    }
    completion += results[i].usage.completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
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
      res_->end();
      if (ctx_.metrics != nullptr) ctx_.metrics->stream_closed();
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
    res_->end();
    if (ctx_.metrics != nullptr) ctx_.metrics->stream_closed();
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
