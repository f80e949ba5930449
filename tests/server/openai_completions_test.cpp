// POST /v1/completions against the real default model: the text_completion
// shape, streaming that adds up to the reply, token-id prompts equal to the
// same text, echo, legacy logprobs, batches of prompts, 400s.
#include "server_test_util.h"

namespace rill::server::testing {
namespace {

class OpenAiCompletions : public ServerTest {};

std::string stream_text(const std::vector<json>& chunks, int index, std::string* finish) {
  std::string text;
  for (const json& c : chunks) {
    EXPECT_EQ(c["object"], "text_completion");
    for (const json& ch : c["choices"]) {
      if (ch["index"] != index) continue;
      text += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) *finish = ch["finish_reason"];
    }
  }
  return text;
}

TEST_F(OpenAiCompletions, TextPromptStreamAndIds) {
  json body = {{"prompt", "The capital of France is"}, {"max_tokens", 8}, {"temperature", 0}};
  auto res = completions(body);
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "smollm2-test");
  ASSERT_EQ(j["choices"].size(), 1u);
  const std::string text = j["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  const std::vector<int32_t> ids = engine_->tokenizer()->encode("The capital of France is", true, true);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["total_tokens"],
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

  // Streamed: the same text, then usage and [DONE].
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto chunks = sse_chunks(*completions(body));
  std::string finish;
  EXPECT_EQ(stream_text(chunks, 0, &finish), text);
  EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], j["usage"]["completion_tokens"]);

  // The prompt as token ids, alone or as a one-element batch.
  for (json prompt : {json(ids), json::array({ids}), json::array({"The capital of France is"})}) {
    json by_ids = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
    auto r = completions(by_ids);
    ASSERT_EQ(r->status(), 200) << r->body();
    EXPECT_EQ(r->json()["choices"][0]["text"], text);
  }

  // echo puts the prompt in front.
  body = {{"prompt", "The capital of France is"}, {"max_tokens", 8}, {"temperature", 0}, {"echo", true}};
  EXPECT_EQ(completions(body)->json()["choices"][0]["text"], "The capital of France is" + text);
  body["stream"] = true;
  EXPECT_EQ(stream_text(sse_chunks(*completions(body)), 0, &finish), "The capital of France is" + text);
}

TEST_F(OpenAiCompletions, LogprobsAndBatches) {
  json body = {{"prompt", json::array({"One, two,", "Red, green,"})},
               {"max_tokens", 4},
               {"temperature", 0},
               {"logprobs", 2},
               {"n", 2}};
  auto res = completions(body);
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  ASSERT_EQ(j["choices"].size(), 4u);  // 2 prompts x n = 2
  for (int i = 0; i < 4; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    const json& lp = c["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    ASSERT_EQ(lp["tokens"].size(), lp["top_logprobs"].size());
    ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size());
    ASSERT_FALSE(lp["tokens"].empty());
    std::string joined;
    for (size_t k = 0; k < lp["tokens"].size(); ++k) {
      EXPECT_EQ(lp["text_offset"][k], joined.size());
      joined += lp["tokens"][k].get<std::string>();
      EXPECT_LE(lp["top_logprobs"][k].size(), 2u);
      EXPECT_GE(lp["top_logprobs"][k].size(), 1u);
      EXPECT_LE(lp["token_logprobs"][k].get<double>(), 0.0);
    }
    EXPECT_EQ(joined, c["text"]);
  }
  // Greedy: the two choices of one prompt agree; the prompts differ.
  EXPECT_EQ(j["choices"][0]["text"], j["choices"][1]["text"]);
  EXPECT_EQ(j["choices"][2]["text"], j["choices"][3]["text"]);
  const auto a = engine_->tokenizer()->encode("One, two,", true, true).size();
  const auto b = engine_->tokenizer()->encode("Red, green,", true, true).size();
  EXPECT_EQ(j["usage"]["prompt_tokens"], a + b);

  // Streamed: the same choices.
  body["stream"] = true;
  auto chunks = sse_chunks(*completions(body));
  for (int i = 0; i < 4; ++i) {
    std::string finish;
    EXPECT_EQ(stream_text(chunks, i, &finish), j["choices"][i]["text"]);
    EXPECT_EQ(finish, j["choices"][i]["finish_reason"]);
  }
}

TEST_F(OpenAiCompletions, StopAndBadRequests) {
  json body = {{"prompt", "1, 2, 3, 4, 5,"}, {"max_tokens", 12}, {"temperature", 0}};
  const std::string full = completions(body)->json()["choices"][0]["text"];
  ASSERT_GE(full.size(), 4u);
  const std::string stop = full.substr(full.size() / 2, 2);
  body["stop"] = stop;
  json j = completions(body)->json();
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt[0]"},
      {R"({"prompt": [1, 999999]})", "prompt"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": ["a", [2, -3]]})", "prompt[1]"},
      {R"({"prompt": "", "max_tokens": 3})", "prompt"},
      {R"({"prompt": "hi", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "hi", "echo": 1})", "echo"},
      {R"({"prompt": "hi", "suffix": "x"})", "suffix"},
      {R"({"prompt": "hi", "max_tokens": 2000})", "max_tokens"},
      {R"({"prompt": "hi", "seed": "x"})", "seed"},
  };
  for (const auto& [b, param] : cases) {
    auto res = call(&handle_completions, b);
    ASSERT_EQ(res->status(), 400) << b << " -> " << res->body();
    EXPECT_EQ(res->json()["error"]["param"], param) << b << " -> " << res->body();
  }
  EXPECT_TRUE(engine_idle());
}

}  // namespace
}  // namespace rill::server::testing
