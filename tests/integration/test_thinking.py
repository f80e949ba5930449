"""Thinking control through the SDKs: Anthropic `thinking` (budget_tokens
enforced), chat reasoning_effort and Responses reasoning.effort (a 400 for a
model without a thinking block), thinking blocks of the history rendered
for templates that replay them, and a grammar that constrains the answer
after the thinking block, not the thinking.

A model that thinks: random weights at a tiny width over the real Qwen3
tokenizer (<think> and </think> are single tokens), served with two real
templates from ../shared/templates: DeepSeek-R1-Distill-Qwen's, whose
generation prompt opens <think> (so the output starts inside the block and
a budget has something to cut), and Qwen3's, which replays the last turns'
reasoning_content. Random weights never write </think> by themselves
(greedy, one id among 151,669), so a closed block is the engine's doing."""
import array
import gzip
import json
import os
import random
import shutil
import struct

import anthropic
import openai
import pytest

from conftest import API_KEY, ROOT, Server

SHARED = os.path.join(os.path.dirname(ROOT), "shared")
TOKENIZER = os.path.join(SHARED, "tokenizers", "qwen3")
TEMPLATES = os.path.join(SHARED, "templates")
VOCAB, HIDDEN, FF, HEAD_DIM = 151936, 16, 32, 8


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (shape, values) in tensors.items():
        data = array.array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def make_model(root, template):
    os.makedirs(root, exist_ok=True)
    rng = random.Random(0)

    def rand(*shape):
        n = 1
        for d in shape:
            n *= d
        return list(shape), [rng.gauss(0.0, 0.5) for _ in range(n)]

    def ones(n):
        return [n], [1.0] * n

    q, kv = 2 * HEAD_DIM, HEAD_DIM
    p = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN),
        "model.norm.weight": ones(HIDDEN),
        p + "input_layernorm.weight": ones(HIDDEN),
        p + "post_attention_layernorm.weight": ones(HIDDEN),
        p + "self_attn.q_proj.weight": rand(q, HIDDEN),
        p + "self_attn.k_proj.weight": rand(kv, HIDDEN),
        p + "self_attn.v_proj.weight": rand(kv, HIDDEN),
        p + "self_attn.o_proj.weight": rand(HIDDEN, q),
        p + "self_attn.q_norm.weight": ones(HEAD_DIM),
        p + "self_attn.k_norm.weight": ones(HEAD_DIM),
        p + "mlp.gate_proj.weight": rand(FF, HIDDEN),
        p + "mlp.up_proj.weight": rand(FF, HIDDEN),
        p + "mlp.down_proj.weight": rand(HIDDEN, FF),
    }
    write_safetensors(os.path.join(root, "model.safetensors"), tensors)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB,
              "hidden_size": HIDDEN, "intermediate_size": FF, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
              "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
              "bos_token_id": 151643, "eos_token_id": 151645}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f)
    with gzip.open(os.path.join(TOKENIZER, "tokenizer.json.gz"), "rb") as src, \
            open(os.path.join(root, "tokenizer.json"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    with open(os.path.join(TOKENIZER, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    with open(os.path.join(TEMPLATES, template)) as f:
        tok_config["chat_template"] = f.read()
    with open(os.path.join(root, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    return root


def serve(path):
    return Server("--api-key", API_KEY, "--ctx-size", "1024", "--kv-cache-mb", "64", "--temperature", "0",
                  model=path)


@pytest.fixture(scope="module")
def thinking_models(tmp_path_factory):
    if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json.gz")):
        pytest.skip("../shared/tokenizers/qwen3 not found")
    root = tmp_path_factory.mktemp("thinking")
    r1 = make_model(str(root / "r1"), "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    qwen3 = str(root / "qwen3")
    os.makedirs(qwen3)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        os.symlink(os.path.join(r1, name), os.path.join(qwen3, name))
    with open(os.path.join(r1, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    with open(os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")) as f:
        tok_config["chat_template"] = f.read()
    with open(os.path.join(qwen3, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    servers = {"r1": serve(r1), "qwen3": serve(qwen3)}
    yield servers
    for s in servers.values():
        s.stop()


def clients(server):
    return (anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120),
            openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120))


MSG = [{"role": "user", "content": "Think, then answer."}]


def test_budget_tokens_closes_the_thinking_block(thinking_models):
    claude, oai = clients(thinking_models["r1"])
    # Unbounded (adaptive): the random model never closes the block, so the
    # whole output is thinking.
    free = claude.messages.create(model="m", max_tokens=24, messages=MSG, thinking={"type": "adaptive"})
    assert [b.type for b in free.content] == ["thinking"]
    assert free.stop_reason == "max_tokens"
    # A budget: after budget_tokens of thinking the engine writes </think>
    # and the model answers; the thinking is a prefix of the free run's.
    budgeted = claude.messages.create(model="m", max_tokens=24, messages=MSG,
                                      thinking={"type": "enabled", "budget_tokens": 6})
    kinds = [b.type for b in budgeted.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    assert budgeted.content[0].thinking
    assert free.content[0].thinking.startswith(budgeted.content[0].thinking.rstrip())
    assert budgeted.usage.output_tokens == 24  # the answer goes on to max_tokens
    # The ids: six thinking tokens, then </think> (chat's rill extension
    # thinking_budget); reasoning_effort low is 1,024 tokens: no cut in 12.
    chat = oai.chat.completions.create(model="m", max_tokens=12, messages=MSG, logprobs=True,
                                       extra_body={"thinking_budget": 6})
    tokens = [t.token for t in chat.choices[0].logprobs.content]
    assert tokens[6] == "</think>" and "</think>" not in tokens[:6], tokens
    assert chat.choices[0].message.reasoning_content
    assert chat.usage.completion_tokens_details.reasoning_tokens == 7  # six and </think> (<think> is the prompt's)
    low = oai.chat.completions.create(model="m", max_tokens=12, messages=MSG, reasoning_effort="low", logprobs=True)
    assert "</think>" not in [t.token for t in low.choices[0].logprobs.content]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=8, messages=MSG, thinking={"type": "enabled", "budget_tokens": 8})
    assert "budget_tokens" in e.value.message


def test_a_grammar_constrains_the_answer_not_the_thinking(thinking_models):
    _, oai = clients(thinking_models["r1"])
    # The block is open from the prompt: its tokens are free (the choice's
    # grammar would allow none of the random model's), the budget closes it,
    # then the answer is one of the choices and ends there.
    r = oai.chat.completions.create(model="m", max_tokens=60, messages=MSG,
                                    extra_body={"choice": ["yes", "no"], "thinking_budget": 5})
    c = r.choices[0]
    assert c.message.reasoning_content
    assert c.message.content in ("yes", "no")
    assert c.finish_reason == "stop"


def test_effort_without_a_thinking_model_is_a_400(openai_client, anthropic_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="m", max_tokens=4, messages=MSG, reasoning_effort="low")
    assert e.value.body["param"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="m", max_tokens=4, messages=MSG,
                                              extra_body={"thinking_budget": 10})
    assert e.value.body["param"] == "thinking_budget"
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.responses.create(model="m", input="hi", max_output_tokens=4, reasoning={"effort": "high"})
    assert e.value.body["param"] == "reasoning.effort"
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(model="m", max_tokens=8, messages=MSG,
                                         thinking={"type": "enabled", "budget_tokens": 4})
    assert "thinking" in e.value.message
    # Asking for no thinking is fine anywhere.
    ok = openai_client.chat.completions.create(model="m", max_tokens=2, messages=MSG, reasoning_effort="none")
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_thinking_blocks_in_the_history_reach_templates_that_replay_them(thinking_models):
    claude, _ = clients(thinking_models["qwen3"])
    tools = [{"name": "get_time", "input_schema": {"type": "object", "properties": {}}}]

    def history(thinking):
        assistant = [{"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}]
        if thinking:
            assistant.insert(0, {"type": "thinking", "thinking": "The user wants the time; call the tool.",
                                 "signature": ""})
        return [{"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"}]}]

    without = claude.messages.count_tokens(model="m", messages=history(False), tools=tools).input_tokens
    with_thinking = claude.messages.count_tokens(model="m", messages=history(True), tools=tools).input_tokens
    assert with_thinking > without + 5
