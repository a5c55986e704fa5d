"""Reasoning controls as llama-server takes them: `chat_template_kwargs.enable_thinking`,
`reasoning_effort`, `reasoning_budget_tokens` (common/reasoning-budget.cpp's sampler), Gemma 4's
thought channel, and a chat format's preserved tokens shown in the reply."""
import json
import pathlib

import openai
import pytest

from llamatui.inference.chat.reasoning import GEMMA4, THINK, ReasoningBudget
from llamatui.inference.chat.replies import reply_stream
from llamatui.inference.chat.tool_calls import ReplyStream

from server_helpers import serve

START, END, NL = 1, 2, 3  # token ids of a toy vocabulary: <think>, </think>, "\n"


def _run(budget: ReasoningBudget, model: list[int], steps: int = 12) -> list[int]:
    """What a model that would write `model` (then 9s) generates under the budget (a forced
    token takes no turn from the model: it goes on with what it would have written next)."""
    out, written = [], iter(model + [9] * steps)
    for _ in range(steps):
        token = budget.forced_token()
        token = next(written) if token is None else token
        budget.accept(token)
        out.append(token)
    return out


def test_budget_zero_ends_thinking_as_soon_as_it_starts():
    budget = ReasoningBudget([START], [[END]], [NL, END], 0)
    assert _run(budget, [5, START, 7, 7, 7], 6) == [5, START, NL, END, 7, 7]


def test_budget_counts_thinking_tokens_then_forces_the_end():
    budget = ReasoningBudget([START], [[END]], [END], 3)
    assert _run(budget, [START, 7, 7, 7, 8, 8], 7) == [START, 7, 7, 7, END, 8, 8]


def test_an_end_the_model_writes_itself_stops_the_count():
    budget = ReasoningBudget([START], [[END]], [END], 3)
    assert _run(budget, [START, 7, END, 8, 8, 8, 8], 7) == [START, 7, END, 8, 8, 8, 8]


def test_a_prompt_that_opens_thinking_arms_the_budget():
    # Qwen 3.5's generation prompt "<think>\n": the "\n" already counts as the first forced
    # token when the budget is 0 (llama.cpp accepts the prefill tokens the same way)
    budget = ReasoningBudget([START], [[NL, END], [END]], [NL, END], 0, prefill=[START, NL])
    assert _run(budget, [7, 7], 3) == [END, 7, 7]
    closed = ReasoningBudget([START], [[END]], [END], 0, prefill=[START, NL, END, NL])
    assert closed.forced_token() is None


def test_a_character_is_finished_before_the_end_is_forced():
    # "日x" in two tokens: the budget runs out inside the character (llama.cpp looks at each
    # token's piece alone, as common_utf8_is_complete)
    pieces = {7: b"\xe6\x97", 8: b"\xa5x", 9: b"x"}
    budget = ReasoningBudget([START], [[END]], [END], 2, piece=lambda t: pieces.get(t, b""))
    assert _run(budget, [START, 9, 7, 8, 9], 6) == [START, 9, 7, 8, END, 9]


def test_a_later_start_tag_rearms_the_budget():
    budget = ReasoningBudget([START], [[END]], [END], 1)
    assert _run(budget, [START, 7, 7, 5, START, 7, 7], 8) == [START, 7, END, 7, 5, START, 7, END]


def test_gemma4_thought_channel_is_reasoning_wherever_it_comes():
    reply = reply_stream(GEMMA4, None, "auto", "")
    pieces = ["<|channel>", "thought", "\n", "Think", ".", "<channel|>", "Hi", "!",
              "<|channel>", "thought", "\n", "More", "<channel|>"]
    deltas = [d for p in pieces for d in reply.feed(p)] + reply.finish()
    assert [next(iter(d)) for d in deltas] == ["reasoning_content"] * 2 + ["content"] * 2 + \
        ["reasoning_content"]
    assert reply.message() == {"role": "assistant", "content": "Hi!",
                               "reasoning_content": "Think.More"}


def test_think_blocks_split_across_pieces():
    reply = ReplyStream(None, True, False, THINK)
    for piece in ["<th", "ink>", "a", "</th", "ink>", "\n", "\n", "b"]:
        reply.feed(piece)
    reply.finish()
    assert reply.message() == {"role": "assistant", "content": "b", "reasoning_content": "a"}


def test_preserved_tokens_are_shown_although_special(smollm2_path):
    from llamatui.inference.tokenizers.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(smollm2_path)
    special = tok.token_to_id("<|im_start|>")
    plain = tok.stream_decoder(unparse_special=False)
    kept = tok.stream_decoder(unparse_special=False, preserved=frozenset([special]))
    ids = [special] + tok.encode("Hi", add_special=False)
    assert "".join(plain.feed(t) for t in ids) + plain.flush() == "Hi"
    assert "".join(kept.feed(t) for t in ids) + kept.flush() == "<|im_start|>Hi"


# ------------------------------------------------------------------ through the server

QWEN35 = pathlib.Path(__file__).parent / "data" / "chat_templates" / "Qwen3.5-4B.jinja"
ASK = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def qwen35_style(smollm2_path):
    """SmolLM2 spoken to in Qwen 3.5's template: the prompt opens <think> itself."""
    with serve(smollm2_path, "-c", "1024", "-np", "1", "-t", "2",
               "--chat-template-file", str(QWEN35)) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=300, max_retries=0), s


def _apply(server, **body):
    status, _, raw = server.post("/apply-template", {"messages": ASK, **body})
    assert status == 200, raw
    return json.loads(raw)["prompt"]


def test_apply_template_takes_the_thinking_switches(qwen35_style):
    _, server = qwen35_style
    assert _apply(server).endswith("<|im_start|>assistant\n<think>\n")
    off = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert _apply(server, chat_template_kwargs={"enable_thinking": False}).endswith(off)
    assert _apply(server, reasoning_effort="none").endswith(off)


def test_thinking_is_on_by_default_and_read_as_reasoning(qwen35_style):
    client, _ = qwen35_style
    r = client.chat.completions.create(model="x", messages=ASK, temperature=0, max_tokens=8)
    message = r.choices[0].message.model_dump()
    assert message.get("reasoning_content")  # SmolLM2 never closes the block it was given


def test_enable_thinking_false_gives_no_reasoning(qwen35_style):
    client, _ = qwen35_style
    r = client.chat.completions.create(
        model="x", messages=ASK, temperature=0, max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message.model_dump()
    assert not message.get("reasoning_content") and message["content"]
    chunks = list(client.chat.completions.create(
        model="x", messages=ASK, temperature=0, max_tokens=8, stream=True,
        extra_body={"reasoning_effort": "none"}))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    assert not any(d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]


def test_enable_thinking_must_be_a_boolean(qwen35_style):
    client, _ = qwen35_style
    with pytest.raises(openai.BadRequestError, match="enable_thinking"):
        client.chat.completions.create(
            model="x", messages=ASK, max_tokens=4,
            extra_body={"chat_template_kwargs": {"enable_thinking": "false"}})


def test_reasoning_budget_zero_closes_thinking_at_once(qwen35_style):
    """Unlimited, SmolLM2 thinks for all 24 tokens (the template opened the block); with a
    budget of 0 the end tag is forced at once and nothing is reasoning (SmolLM2 then ends its
    turn: its reply is the forced tag's 3 tokens and EOG)."""
    client, _ = qwen35_style
    r = client.chat.completions.create(model="x", messages=ASK, temperature=0, max_tokens=24,
                                       extra_body={"reasoning_budget_tokens": 0})
    message = r.choices[0].message.model_dump()
    assert not message.get("reasoning_content")
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 24


def test_reasoning_budget_limits_thinking(qwen35_style):
    client, _ = qwen35_style
    r = client.chat.completions.create(
        model="x", messages=ASK, temperature=0, max_tokens=24,
        extra_body={"thinking_budget_tokens": 3, "reasoning_budget_message": " Enough."})
    reasoning = r.choices[0].message.model_dump()["reasoning_content"]
    # the prefilled "\n" counts: two tokens of the model's own, then the message and "\n"
    assert reasoning.endswith(" Enough.\n") and len(reasoning.split()) == 2


GPT_OSS = pathlib.Path(__file__).parent / "data" / "chat_templates" / "openai-gpt-oss-120b.jinja"


@pytest.fixture(scope="module")
def gpt_oss_style(smollm2_path):
    """SmolLM2 spoken to in gpt-oss's template (Harmony)."""
    with serve(smollm2_path, "-c", "2048", "-np", "1", "-t", "2",
               "--chat-template-file", str(GPT_OSS)) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=300, max_retries=0), s


def test_reasoning_effort_reaches_gpt_oss_template(gpt_oss_style):
    _, server = gpt_oss_style
    assert "\nReasoning: medium\n" in _apply(server)
    assert "\nReasoning: high\n" in _apply(server, reasoning_effort="high")
    assert "\nReasoning: low\n" in _apply(server, chat_template_kwargs={"reasoning_effort": "low"})


def test_gpt_oss_history_with_reasoning_and_a_tool_call_renders(gpt_oss_style):
    """The earlier call's reasoning goes to the template as `thinking` and its empty content is
    dropped (the template refuses a tool-calling message with both)."""
    client, _ = gpt_oss_style
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    history = ASK + [
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = client.chat.completions.create(model="x", messages=history, tools=[tool],
                                       temperature=0, max_tokens=6)
    assert r.choices[0].finish_reason in ("stop", "length")  # rendered and generated
