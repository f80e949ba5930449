#pragma once
// What /v1/chat/completions and /v1/completions share: typed reads of
// request fields (400 naming the field), the sampling and generation fields
// both accept, logprobs and usage JSON, and OpenAiCall, which runs the n
// generations of one request and writes them to one Responder.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_stream.h"
#include "server/errors.h"
#include "server/field_reader.h"
#include "server/http.h"
#include "server/server_context.h"

namespace rill::server::openai {

using ojson = nlohmann::ordered_json;

// The request body as a JSON object, parsed by parse_json (depth-limited,
// linear): 400 for malformed JSON, nesting deeper than kMaxJsonDepth (naming
// the path) or a non-object.
std::variant<ojson, ApiError> parse_body(const std::string& body);

// What reading a request needs from the server (so the readers run, and are
// fuzzed, without a loaded model).
struct RequestLimits {
  std::string model_id;        // reported when the request names no model
  int max_n = 8;               // choices per request
  int32_t max_tokens_cap = 0;  // 0: none
  int64_t n_vocab = 0;         // logit_bias token ids are in [0, n_vocab)
  // max_tokens: 0 is valid (completions with echo: score the prompt only).
  bool allow_zero_max_tokens = false;
};
RequestLimits request_limits(const ServerContext& ctx);

// The fields both endpoints accept.
struct CommonFields {
  std::string model;  // as sent, or the served model id
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;
  SamplingOverrides sampling;
  GenerationRequest generation;  // max_tokens (0: as many as fit), stop, ignore_eos, prompt_only
  std::vector<std::pair<int32_t, float>> logit_bias;
};
// model, stream, stream_options, n, temperature, top_p, top_k, min_p, seed,
// presence/frequency/repetition_penalty, max_tokens/max_completion_tokens,
// stop, logit_bias, ignore_eos.
std::optional<ApiError> read_common(const RequestLimits& limits, const FieldReader& body, CommonFields& out);

// A /v1/chat/completions request, read and validated (the messages
// themselves are checked when the prompt is rendered: chat_stream.h).
struct ChatRequest {
  CommonFields common;
  ChatInput input;        // messages, tools (after tool_choice), template_kwargs
  bool logprobs = false;  // common.generation.logprobs holds top_logprobs
};
std::variant<ChatRequest, ApiError> parse_chat_request(const RequestLimits& limits, const ojson& body);

// The request for choice `index`: sampling resolved, seed + index when a
// seed was given.
GenerationRequest choice_request(const ServerContext& ctx, const CommonFields& f, int index);

std::string new_id(const char* prefix);  // prefix + 24 random alphanumerics
int64_t unix_time();
std::string json_text(const ojson& j);  // compact; invalid UTF-8 replaced
inline constexpr const char* kSystemFingerprint = "fp_rill";

// The logprob entries to show for an event or a result: the EOS / stop token
// that ended the generation is not part of the output.
std::span<const SampledToken> shown_logprobs(const GenerationEvent& event);
std::span<const SampledToken> shown_logprobs(const ChatResult& result);
// Chat: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
ojson chat_logprobs(const Tokenizer& tok, std::span<const SampledToken> entries);
// Legacy completions: appends to {tokens, token_logprobs, top_logprobs,
// text_offset}; `offset` is the running text offset.
void append_completion_logprobs(const Tokenizer& tok, std::span<const SampledToken> entries, ojson& out,
                                size_t& offset);
ojson empty_completion_logprobs();
// Echo: the prompt's entries in front, the first token's logprob and
// top_logprobs null (nothing predicts it), `scores` those of prompt[1..];
// `offset` as above, from 0.
void append_prompt_logprobs(const Tokenizer& tok, std::span<const int32_t> prompt, std::span<const SampledToken> scores,
                            ojson& out, size_t& offset);

// {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details:
// {cached_tokens}} over results where every `per_prompt` consecutive results
// share one prompt.
ojson usage_json(const std::vector<ChatResult>& results, size_t per_prompt);

// One request's generations (n choices, or prompts x n), written to one
// Responder. Streaming: the response starts once every generation was
// submitted (then open_frames()), each delta and each choice's end become
// frames, then close_frames(), "data: [DONE]" and end(). Not streaming: one
// JSON body once all are done. A generation that fails ends the whole
// reply: a 500 before streaming, an error frame + [DONE] after. The client
// going away cancels every generation. The frame builders run with the
// call's mutex held, on the engine's event dispatcher thread (or the handler's, for open).
class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  struct Job {
    const ChatPrompt* prompt;
    GenerationRequest generation;
  };
  OpenAiCall(ServerContext& ctx, std::shared_ptr<Responder> res, bool stream, std::string id);
  virtual ~OpenAiCall() = default;
  // Submits every job; if one is refused, cancels the others and sends its error.
  void run(std::vector<Job> jobs);

 protected:
  virtual std::string open_frames() { return ""; }
  virtual std::string delta_frames(size_t index, const OutputDelta& delta, const GenerationEvent& event) = 0;
  virtual std::string finish_frames(size_t index, const ChatResult& result) = 0;
  virtual std::string close_frames(const std::vector<ChatResult>& results) = 0;
  virtual ojson response(const std::vector<ChatResult>& results) = 0;

  // {id, object, created, model, system_fingerprint, choices}: the shell of
  // every chunk and reply of this call.
  ojson envelope(const char* object, const std::string& model, ojson choices) const;

  ServerContext& ctx_;
  const bool stream_;
  const std::string id_;
  const int64_t created_;

 private:
  void on_delta(size_t index, const OutputDelta& delta, const GenerationEvent& event);
  void on_done(size_t index, const ChatResult& result);
  void cancel_all();  // requires mu_

  std::shared_ptr<Responder> res_;
  std::mutex mu_;  // orders the writes of the engine and I/O threads; guards below
  std::vector<std::shared_ptr<ChatStream>> streams_;
  std::vector<ChatResult> results_;
  size_t n_done_ = 0;
  bool closed_ = false;  // the reply is complete (or failed); later events are dropped
};

}  // namespace rill::server::openai
