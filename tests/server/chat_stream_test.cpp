// The shared chat pipeline: what the template sees (messages normalised,
// developer -> system, tool-call arguments as objects, tools, kwargs, BOS/EOS
// strings), prompts that open a think block, sampling precedence, default and
// capped max_tokens, and ChatStream's callbacks over the real model.
#include "server/chat_stream.h"

#include <atomic>
#include <fstream>
#include <set>

#include "server_test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill::server::testing {
namespace {

using ojson = nlohmann::ordered_json;

class ChatStreamTest : public ServerTest {
 protected:
  // Renders `in` with `source` as the model's template; the prompt as text.
  std::string render_with(const std::string& source, const ChatInput& in, bool* starts_in_reasoning = nullptr) {
    auto t = ChatTemplate::parse(source);
    EXPECT_TRUE(t.ok()) << t.error().message;
    tmpl_ = std::make_unique<ChatTemplate>(std::move(t).value());
    ctx_->chat_template = tmpl_.get();
    auto ids = render_chat_prompt(*ctx_, in, starts_in_reasoning);
    EXPECT_TRUE(ids.ok()) << ids.error().message;
    return ids.ok() ? engine_->tokenizer()->decode(ids.value(), /*skip_special=*/false) : "";
  }
  std::unique_ptr<ChatTemplate> tmpl_;
};

TEST_F(ChatStreamTest, TemplateContext) {
  ChatInput in;
  in.messages = ojson::parse(R"([
    {"role": "developer", "content": "S"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "w", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  const std::string source =
      "{%- for m in messages %}[{{ m.role }}|{{ m.content }}"
      "{%- if m.tool_calls %}|{{ m.tool_calls[0].function.arguments.city }}"
      "{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}"
      "{%- if m.tool_call_id %}|{{ m.tool_call_id }}{% endif %}]{% endfor %}"
      " tools={{ tools | tojson }} think={{ enable_thinking }} gen={{ add_generation_prompt }}"
      " bos={{ bos_token }} eos={{ eos_token }}";
  const Tokenizer& tok = *engine_->tokenizer();
  const std::string bos = tok.bos_id() ? tok.token_to_piece(*tok.bos_id()) : "";
  const std::string eos = tok.eos_id() ? tok.token_to_piece(*tok.eos_id()) : "";
  EXPECT_EQ(render_with(source, in),
            "[system|S][user|a\nb][assistant||Paris{\"city\": \"Paris\", \"days\": 2}][tool|sunny|c1]"
            " tools=null think= gen=True bos=" +
                bos + " eos=" + eos);

  in.tools = ojson::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {"z": 1, "a": 2}}}])");
  in.template_kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(render_with(source, in),
            "[system|S][user|a\nb][assistant||Paris{\"city\": \"Paris\", \"days\": 2}][tool|sunny|c1]"
            " tools=[{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"z\": 1, \"a\": 2}}}]"
            " think=False gen=True bos=" +
                bos + " eos=" + eos);

  // The prepared prompt parses tool calls when tools were passed, and knows
  // when the template opened a think block.
  auto p = prepare_chat_prompt(*ctx_, in);
  ASSERT_TRUE(std::holds_alternative<ChatPrompt>(p));
  EXPECT_TRUE(std::get<ChatPrompt>(p).parser.parse_tool_calls);
  EXPECT_FALSE(std::get<ChatPrompt>(p).parser.starts_in_reasoning);
  bool in_think = false;
  render_with("{{ messages[0].content }}<think>\n", in, &in_think);
  EXPECT_TRUE(in_think);
  render_with("<think>x</think>", in, &in_think);
  EXPECT_FALSE(in_think);
}

TEST_F(ChatStreamTest, TemplateErrorsAndBadMessages) {
  ChatInput in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "x"}])");
  auto t = ChatTemplate::parse("{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  ctx_->chat_template = &t.value();
  auto p = prepare_chat_prompt(*ctx_, in);
  ASSERT_TRUE(std::holds_alternative<ApiError>(p));
  EXPECT_EQ(std::get<ApiError>(p).status, 400);
  EXPECT_NE(std::get<ApiError>(p).message.find("roles must alternate"), std::string::npos);
  EXPECT_EQ(std::get<ApiError>(p).param, "");

  in.messages = ojson::parse(R"([{"role": "user", "content": "x"}, {"role": "user", "name": 3, "content": "y"}])");
  p = prepare_chat_prompt(*ctx_, in);
  ASSERT_TRUE(std::holds_alternative<ApiError>(p));
  EXPECT_EQ(std::get<ApiError>(p).param, "messages[1].name");

  ApiError e = api_error_from(Error{"max_tokens: too many"});
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(api_error_from(Error{"chat template error: line 1: x"}, 500).param, "");
  EXPECT_EQ(api_error_from(Error{"x"}, 500).type, "server_error");
}

TEST_F(ChatStreamTest, SamplingPrecedence) {
  SamplingOverrides none;
  SamplingParams p = resolve_sampling(*ctx_, none);  // built-in
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FALSE(p.seed.has_value());

  GenerationDefaults model;
  model.temperature = 0.6f;
  model.top_p = 0.95f;
  model.top_k = 20;
  ctx_->generation = &model;
  p = resolve_sampling(*ctx_, none);
  EXPECT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 20);

  ctx_->options.temperature = 0.3f;
  ctx_->options.top_k = 5;
  p = resolve_sampling(*ctx_, none);
  EXPECT_EQ(p.temperature, 0.3f);
  EXPECT_EQ(p.top_k, 5);
  EXPECT_EQ(p.top_p, 0.95f);

  SamplingOverrides req;
  req.temperature = 0.0f;
  req.seed = 9;
  req.presence_penalty = 0.5f;
  p = resolve_sampling(*ctx_, req);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, 5);
  EXPECT_EQ(p.seed, 9u);
  EXPECT_EQ(p.presence_penalty, 0.5f);

  // do_sample false: greedy unless the server or the request says otherwise.
  GenerationDefaults greedy;
  greedy.do_sample = false;
  greedy.temperature = 0.7f;
  ctx_->generation = &greedy;
  ctx_->options.temperature.reset();
  EXPECT_EQ(resolve_sampling(*ctx_, none).temperature, 0.0f);
  ctx_->generation = nullptr;
}

TEST_F(ChatStreamTest, StreamCallbacksAndMaxTokens) {
  ChatInput in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "Say something."}])");
  in.generation.max_tokens = 0;  // as many as fit, capped by default_max_tokens
  in.generation.sampling.temperature = 0.0f;
  in.generation.ignore_eos = true;
  ctx_->options.default_max_tokens = 5;

  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::string content;
    int n_deltas = 0, n_done = 0;
    ChatResult result;
  };
  auto seen = std::make_shared<Seen>();
  ChatCallbacks cb;
  cb.on_delta = [seen](const OutputDelta& d, const GenerationEvent&) {
    std::lock_guard lk(seen->mu);
    seen->content += d.content;
    ++seen->n_deltas;
  };
  cb.on_done = [seen](const ChatResult& r) {
    std::lock_guard lk(seen->mu);
    seen->result = r;
    ++seen->n_done;
    seen->cv.notify_all();
  };
  auto started = ChatStream::start(*ctx_, in, cb);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<ChatStream>>(started));
  {
    std::unique_lock lk(seen->mu);
    ASSERT_TRUE(seen->cv.wait_for(lk, std::chrono::seconds(30), [&] { return seen->n_done == 1; }));
  }
  EXPECT_TRUE(engine_idle());
  EXPECT_EQ(seen->n_done, 1);
  EXPECT_EQ(seen->result.finish_reason, "length");
  EXPECT_EQ(seen->result.usage.completion_tokens, 5);
  EXPECT_EQ(seen->result.token_ids.size(), 5u);
  EXPECT_EQ(seen->content, seen->result.content);
  EXPECT_EQ(seen->result.content, engine_->tokenizer()->decode(seen->result.token_ids, true));
  EXPECT_GE(seen->n_deltas, 5);

  // A prompt ending inside <think>: the output is reasoning.
  auto t =
      ChatTemplate::parse("<|im_start|>user\n{{ messages[0].content }}<|im_end|>\n<|im_start|>assistant\n<think>\n");
  ASSERT_TRUE(t.ok());
  ctx_->chat_template = &t.value();
  seen->n_done = 0;
  started = ChatStream::start(*ctx_, in, cb);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<ChatStream>>(started));
  {
    std::unique_lock lk(seen->mu);
    ASSERT_TRUE(seen->cv.wait_for(lk, std::chrono::seconds(30), [&] { return seen->n_done == 1; }));
  }
  const std::string text = engine_->tokenizer()->decode(seen->result.token_ids, true);
  if (text.find("</think>") == std::string::npos) {
    EXPECT_EQ(seen->result.content, "");
    EXPECT_FALSE(seen->result.reasoning.empty());
  }

  // max_tokens beyond the context or the server cap: 400 naming max_tokens.
  in.generation.max_tokens = 1020;
  auto refused = ChatStream::start(*ctx_, in, cb);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "max_tokens");
  ctx_->options.max_tokens_cap = 4;
  in.generation.max_tokens = 5;
  refused = ChatStream::start(*ctx_, in, cb);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "max_tokens");
  EXPECT_TRUE(engine_idle());
}

// gpt-oss: reasoning_effort reaches the harmony template as its
// `reasoning_effort` variable ("Reasoning: low" in the system message),
// rendered as jinja2 renders it (tests/data/templates/gpt_oss.json, up to
// the date strftime_now writes), instead of a thinking budget.
TEST_F(ChatStreamTest, HarmonyReasoningEffortIsTheTemplatesVariable) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/templates/gpt_oss.json");
  ASSERT_TRUE(f.good());
  const ojson golden = ojson::parse(f);
  auto without_date = [](std::string text) {
    constexpr std::string_view kDate = "Current date: ";
    const size_t at = text.find(kDate);
    if (at != std::string::npos) text.replace(at + kDate.size(), 10, "YYYY-MM-DD");
    return text;
  };
  auto expected = [&](const std::string& name) {
    for (const ojson& c : golden["cases"]) {
      if (c["name"] == name) return without_date(c["expected"].get<std::string>());
    }
    ADD_FAILURE() << name;
    return std::string();
  };
  auto t = ChatTemplate::parse(golden["template"].get<std::string>());
  ASSERT_TRUE(t.ok()) << t.error().message;
  ctx_->chat_template = &t.value();
  ChatInput in;
  for (const ojson& c : golden["cases"]) {
    if (c["name"] == "single_user") in.messages = c["context"]["messages"];
  }
  const std::pair<const char*, const char*> kCases[] = {{"", "single_user"},
                                                        {"low", "reasoning_effort_low"},
                                                        {"medium", "single_user"},
                                                        {"high", "reasoning_effort_high"}};
  std::set<std::string> prompts;
  for (const auto& [effort, case_name] : kCases) {
    SCOPED_TRACE(effort);
    in.reasoning_effort.reset();
    in.thinking.reset();
    if (*effort) {
      // As the chat adapter sets them: the effort, and the budget it stands for elsewhere.
      in.reasoning_effort = ChatInput::ReasoningEffort{"reasoning_effort", effort};
      in.thinking = ChatInput::ThinkingRequest{"reasoning_effort", thinking_budget_for_effort(effort).value()};
    }
    auto p = prepare_chat_prompt(*ctx_, in);
    ASSERT_TRUE(std::holds_alternative<ChatPrompt>(p)) << std::get<ApiError>(p).message;
    EXPECT_FALSE(std::get<ChatPrompt>(p).thinking.tracked());
    const std::string text = engine_->tokenizer()->decode(std::get<ChatPrompt>(p).ids, /*skip_special=*/false);
    EXPECT_EQ(without_date(text), expected(case_name));
    prompts.insert(text);
  }
  EXPECT_EQ(prompts.size(), 3u);  // low, medium (the default), high
  // An explicit chat_template_kwargs.reasoning_effort wins.
  in.template_kwargs = {{"reasoning_effort", "high"}};
  in.reasoning_effort = ChatInput::ReasoningEffort{"reasoning_effort", "low"};
  auto p = prepare_chat_prompt(*ctx_, in);
  ASSERT_TRUE(std::holds_alternative<ChatPrompt>(p));
  EXPECT_EQ(without_date(engine_->tokenizer()->decode(std::get<ChatPrompt>(p).ids, false)),
            expected("reasoning_effort_high"));
}

// Through the chat and Responses handlers: the effort reaches the template
// (this one raises unless it is low; its comment makes it harmony's), and
// efforts harmony lacks are 400s naming the field.
TEST_F(ChatStreamTest, HarmonyReasoningEffortThroughTheApis) {
  auto t = ChatTemplate::parse(
      "{#- <|channel|> <|call|> #}{% if reasoning_effort != 'low' %}{{ raise_exception('effort ' + "
      "reasoning_effort|string) }}{% endif %}<|im_start|>user\n{{ messages[-1].content }}<|im_end|>\n"
      "<|im_start|>assistant\n");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ctx_->chat_template = &t.value();
  const json msgs = json::parse(R"([{"role": "user", "content": "hi"}])");
  auto res = chat({{"messages", msgs}, {"max_tokens", 1}, {"reasoning_effort", "low"}});
  EXPECT_EQ(res->status(), 200) << res->body();
  res = chat({{"messages", msgs}, {"max_tokens", 1}, {"reasoning_effort", "high"}});
  EXPECT_EQ(res->status(), 400);
  EXPECT_NE(res->body().find("effort high"), std::string::npos) << res->body();
  res = call(&handle_responses_create,
             json{{"input", "hi"}, {"max_output_tokens", 1}, {"reasoning", {{"effort", "low"}}}}.dump());
  EXPECT_EQ(res->status(), 200) << res->body();
  res = call(&handle_responses_create,
             json{{"input", "hi"}, {"max_output_tokens", 1}, {"reasoning", {{"effort", "high"}}}}.dump());
  EXPECT_EQ(res->status(), 400);
  EXPECT_NE(res->body().find("effort high"), std::string::npos) << res->body();
  for (const char* effort : {"none", "minimal"}) {
    res = chat({{"messages", msgs}, {"max_tokens", 1}, {"reasoning_effort", effort}});
    EXPECT_EQ(res->status(), 400);
    EXPECT_EQ(json::parse(res->body())["error"]["param"], "reasoning_effort") << res->body();
  }
  for (const char* effort : {"minimal", "xhigh"}) {
    res = call(&handle_responses_create,
               json{{"input", "hi"}, {"max_output_tokens", 1}, {"reasoning", {{"effort", effort}}}}.dump());
    EXPECT_EQ(res->status(), 400);
    EXPECT_EQ(json::parse(res->body())["error"]["param"], "reasoning.effort") << res->body();
  }
}

// Granite 3.3's template renders tools but drops an assistant turn's
// tool_calls: they reach it as the text the model writes for them.
TEST_F(ChatStreamTest, GraniteEarlierCallsBecomeTheirCallText) {
  std::ifstream f(std::string(RILL_SHARED_DIR) + "/templates/ibm-granite-granite-3.3-2B-Instruct.jinja");
  ASSERT_TRUE(f.good());
  const std::string source((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ChatInput in;
  in.messages = ojson::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  in.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const std::string prompt = render_with(source, in);
  EXPECT_NE(prompt.find("<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{\"name\": \"get_weather\", "
                        "\"arguments\": {\"city\":\"Paris\"}}]<|end_of_text|>\n<|start_of_role|>tool"),
            std::string::npos)
      << prompt;
  // The parser reads that text back to the call.
  OutputParserOptions options;
  options.parse_tool_calls = true;
  OutputParser parser(options);
  OutputDelta d;
  parser.push(granite_tool_calls_text(in.messages[1]["tool_calls"]), d);
  parser.finish(d);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
}

}  // namespace
}  // namespace rill::server::testing
