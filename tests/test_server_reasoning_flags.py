"""`llamatui serve`'s reasoning defaults, as llama-server's (common/arg.cpp): --reasoning-format,
-rea/--reasoning, --reasoning-effort, --chat-template-kwargs, --reasoning-budget and
--reasoning-budget-message; a request's own fields override them (oaicompat_chat_params_parse
merges the server's default_template_kwargs under the request's chat_template_kwargs)."""
import json
import pathlib

import pytest

from llamatui.app.cli import build_parser
from llamatui.app.cli.serve import server_config
from llamatui.app.server import ServerConfig
from llamatui.app.server.requests import reasoning_options

from server_helpers import serve

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"
QWEN35 = TEMPLATES / "Qwen3.5-4B.jinja"
GPT_OSS = TEMPLATES / "openai-gpt-oss-120b.jinja"
ASK = [{"role": "user", "content": "Name a colour."}]
THINKING_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen 3.5's prompt end
THINKING_ON = "<|im_start|>assistant\n<think>\n"


def _config(*flags: str) -> ServerConfig:
    return server_config(build_parser({"serve"}).parse_args(["serve", "-m", "x", *flags]))


# ------------------------------------------------------------------ the command line

def test_the_defaults_change_nothing():
    config = _config()
    assert (config.reasoning_format, config.template_kwargs, config.reasoning_budget,
            config.reasoning_budget_message) == ("auto", {}, -1, "")


@pytest.mark.parametrize("word, thinking", [
    ("on", True), ("enabled", True), ("true", True), ("1", True),
    ("off", False), ("disabled", False), ("false", False), ("0", False)])
def test_reasoning_switch_takes_llama_cpps_words(word, thinking):
    assert _config("-rea", word).template_kwargs == {"enable_thinking": thinking}


@pytest.mark.parametrize("word", ["auto", "-1"])
def test_reasoning_auto_leaves_the_template_variables_alone(word):
    assert _config("--reasoning", word).template_kwargs == {}


def test_template_variable_flags_apply_in_command_line_order():
    """As llama.cpp's handlers, each flag edits default_template_kwargs in turn: the last to
    set a key wins, and --reasoning-effort default removes the level."""
    config = _config("--reasoning", "off", "--chat-template-kwargs",
                     '{"enable_thinking": true, "model_identity": "Zed", "n": [1, 2]}')
    assert config.template_kwargs == {"enable_thinking": True, "model_identity": "Zed",
                                      "n": [1, 2]}
    config = _config("--chat-template-kwargs", '{"enable_thinking": true}', "-rea", "off",
                     "--reasoning-effort", "high")
    assert config.template_kwargs == {"enable_thinking": False, "reasoning_effort": "high"}
    assert _config("--reasoning-effort", "high", "--reasoning-effort", "default"
                   ).template_kwargs == {}


def test_budget_format_and_message_reach_the_settings():
    config = _config("--reasoning-budget", "0", "--reasoning-budget-message", " Enough.",
                     "--reasoning-format", "deepseek-legacy")
    assert (config.reasoning_budget, config.reasoning_budget_message,
            config.reasoning_format) == (0, " Enough.", "deepseek-legacy")


def test_a_request_overrides_the_server_defaults():
    config = ServerConfig(template_kwargs={"enable_thinking": False, "reasoning_effort": "high",
                                           "model_identity": "Zed"},
                          reasoning_budget=0, reasoning_budget_message=" Enough.")
    assert reasoning_options({}, config) == (
        {"enable_thinking": False, "reasoning_effort": "high", "model_identity": "Zed"},
        0, " Enough.")
    variables, budget, message = reasoning_options(
        {"chat_template_kwargs": {"enable_thinking": True, "model_identity": "Ann"},
         "reasoning_effort": "low", "reasoning_budget_tokens": 5,
         "reasoning_budget_message": ""}, config)
    assert variables == {"enable_thinking": True, "reasoning_effort": "low",
                         "model_identity": "Ann"}
    assert (budget, message) == (5, "")
    # reasoning_effort none switches thinking off and drops the server's level
    effort = ServerConfig(template_kwargs={"reasoning_effort": "high", "model_identity": "Zed"})
    assert reasoning_options({"reasoning_effort": "none"}, effort)[0] == \
        {"enable_thinking": False, "model_identity": "Zed"}
    # llama-server reads a request's budget of -1 (or none) as "the server's"
    assert reasoning_options({"thinking_budget_tokens": -1}, config)[1] == 0


# ------------------------------------------------------------------ through the server

def _apply(server, **body) -> str:
    status, _, raw = server.post("/apply-template", {"messages": ASK, **body})
    assert status == 200, raw
    return json.loads(raw)["prompt"]


def _chat(server, **body) -> dict:
    status, _, raw = server.post("/v1/chat/completions", {
        "messages": ASK, "temperature": 0, "max_tokens": 24, **body})
    assert status == 200, raw
    return json.loads(raw)


@pytest.fixture(scope="module")
def thinking_off(smollm2_path):
    """SmolLM2 in Qwen 3.5's template, served with thinking off and a budget of 0."""
    with serve(smollm2_path, "-c", "1024", "-np", "1", "-t", "2", "--chat-template-file",
               str(QWEN35), "--reasoning", "off", "--reasoning-budget", "0") as s:
        yield s


def test_reasoning_off_renders_enable_thinking_false(thinking_off):
    assert _apply(thinking_off).endswith(THINKING_OFF)
    on = _apply(thinking_off, chat_template_kwargs={"enable_thinking": True})
    assert on.endswith(THINKING_ON)
    answer = _chat(thinking_off)["choices"][0]["message"]
    assert answer["content"] and not answer.get("reasoning_content")


def test_reasoning_budget_zero_forces_the_end_tag(thinking_off):
    """With thinking switched back on by the request, the server's budget of 0 forces the end
    tag at once (SmolLM2 left alone thinks for all 24 tokens: test_reasoning.py); a request's
    -1 is the server's budget too, and its own budget replaces the server's."""
    for budget in ({}, {"reasoning_budget_tokens": -1}):
        r = _chat(thinking_off, chat_template_kwargs={"enable_thinking": True}, **budget)
        assert not r["choices"][0]["message"].get("reasoning_content")
        assert r["choices"][0]["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] < 24
    r = _chat(thinking_off, chat_template_kwargs={"enable_thinking": True},
              reasoning_budget_tokens=3, reasoning_budget_message=" Enough.")
    assert r["choices"][0]["message"]["reasoning_content"].endswith(" Enough.\n")


@pytest.fixture(scope="module")
def reasoning_in_content(smollm2_path):
    """Qwen 3.5's template (thinking on), --reasoning-format none, a budget of 3 and a message."""
    with serve(smollm2_path, "-c", "1024", "-np", "1", "-t", "2", "--chat-template-file",
               str(QWEN35), "--reasoning-format", "none", "--reasoning-budget", "3",
               "--reasoning-budget-message", " Enough.") as s:
        yield s


def test_reasoning_format_none_keeps_thinking_in_the_content(reasoning_in_content):
    answer = _chat(reasoning_in_content)["choices"][0]["message"]
    assert not answer.get("reasoning_content")
    assert answer["content"].startswith("<think>\n")
    assert answer["content"].endswith(" Enough.\n</think>")  # the server's budget and message


def test_a_request_overrides_the_format_and_the_message(reasoning_in_content):
    """deepseek-legacy reads as deepseek (llama.cpp 11434's parsers split reasoning out for
    every format but none)."""
    for fmt in ("deepseek-legacy", "deepseek"):
        answer = _chat(reasoning_in_content, reasoning_format=fmt)["choices"][0]["message"]
        assert answer["reasoning_content"].endswith(" Enough.\n")
        assert "<think>" not in answer["content"]
    answer = _chat(reasoning_in_content, reasoning_budget_message=" Stop.")
    assert answer["choices"][0]["message"]["content"].endswith(" Stop.\n</think>")


@pytest.fixture(scope="module")
def gpt_oss_template_kwargs(smollm2_path):
    """gpt-oss's template with a reasoning effort and a model identity given by the server."""
    with serve(smollm2_path, "-c", "2048", "-np", "1", "-t", "2", "--chat-template-file",
               str(GPT_OSS), "--reasoning-effort", "high", "--chat-template-kwargs",
               '{"model_identity": "You are Zed."}') as s:
        yield s


def test_chat_template_kwargs_reach_the_template_and_requests_override(
        gpt_oss_template_kwargs):
    server = gpt_oss_template_kwargs
    prompt = _apply(server)
    assert "You are Zed.\n" in prompt and "\nReasoning: high\n" in prompt
    prompt = _apply(server, chat_template_kwargs={"model_identity": "You are Ann."})
    assert "You are Ann.\n" in prompt and "Zed" not in prompt
    assert "\nReasoning: high\n" in prompt  # the server's other variables stay
    assert "\nReasoning: low\n" in _apply(server, reasoning_effort="low")
