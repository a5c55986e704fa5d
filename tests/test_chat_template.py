"""Chat templates: llama.cpp's prompts for both starter models and its built-in templates, the
sandbox and its limits, HF's helpers, the --chat-template flag."""
import ctypes
import datetime
import json
import re
import subprocess
import sys
import threading
import time

import pytest

from llamatui.app.cli.engine_args import chat_template_from_args
from llamatui.inference import CHAT_TEMPLATE_NAMES
from llamatui.inference.chat.template import (
    ChatTemplate, ChatTemplateError, ChatTemplateLimitError, ChatTemplateSecurityError,
    template_for_vocabulary)
from llamatui.inference.gguf import GGUFFile

USER = [{"role": "user", "content": "Hi"}]


def _from_file(path) -> ChatTemplate:
    with GGUFFile.open(path) as f:
        return ChatTemplate.from_metadata(f.metadata)


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path):
    return _from_file(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_template(gemma3_path):
    return _from_file(gemma3_path)


@pytest.fixture(scope="module")
def golden_builtin(golden_dir):
    # libllama's llama_chat_apply_template for every built-in name (record_chat_builtin.py)
    return json.loads((golden_dir / "llama_cpp_chat_builtin.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# llama.cpp's prompts


def test_smollm2_prompts_equal_llama_cpp(smollm2_template, golden_smollm2):
    cases = golden_smollm2["chat_template"]
    assert cases
    assert smollm2_template.name is None and smollm2_template.origin == "model"
    for case in cases:
        assert smollm2_template.render(case["messages"]) == case["prompt"]


def test_gemma3_without_template_is_spoken_to_in_gemma_turns(gemma3_template, golden_gemma3,
                                                             golden_builtin):
    # Deliberately not llama.cpp 0.6.0's choice. Gemma 3 270M's GGUF has no chat template, and
    # llama.cpp renders ChatML for it (the golden prompts below); Gemma then answers in its own
    # turns and leaks "<|im_end|> <|im_start|>user ..." into replies. A vocabulary with Gemma's
    # <start_of_turn> gets llama.cpp's built-in "gemma" template instead (the one llama.cpp
    # picks for a template text containing that marker), rendered exactly as libllama renders it.
    assert gemma3_template.name == "gemma" and gemma3_template.origin == "vocabulary"
    cases = golden_gemma3["chat_template"]
    conversations = golden_builtin["conversations"]
    for case in cases:
        llama_cpp = next(r["prompt"] for r in golden_builtin["renders"]["gemma"]
                         if conversations[r["conversation"]] == case["messages"]
                         and r["add_generation_prompt"])
        assert gemma3_template.render(case["messages"]) == llama_cpp
        assert case["prompt"].startswith("<|im_start|>")  # what llama.cpp 0.6.0 rendered
    # llama.cpp's ChatML is one choice away, byte for byte
    chatml = ChatTemplate("chatml")
    for case in cases:
        assert chatml.render(case["messages"]) == case["prompt"]


def test_a_template_for_models_without_one():
    assert template_for_vocabulary(["<pad>", "<start_of_turn>", "<end_of_turn>"]) == "gemma"
    assert template_for_vocabulary(["<s>", "</s>"]) == "chatml"
    assert template_for_vocabulary(None) == "chatml"
    meta = {"tokenizer.ggml.tokens": ["<bos>", "<eos>", "<start_of_turn>"],
            "tokenizer.ggml.bos_token_id": 0}
    assert ChatTemplate.from_metadata(meta).name == "gemma"
    # the model's own template wins, and the caller's choice over both
    own = ChatTemplate.from_metadata({**meta, "tokenizer.chat_template": "{{ 'x' }}"})
    assert own.name is None and own.origin == "model" and own.render(USER) == "x"
    chosen = ChatTemplate.from_metadata(meta, "llama3")
    assert chosen.name == "llama3" and chosen.origin == "override"
    assert ChatTemplate.from_metadata(meta, "{{ 'y' }}").render(USER) == "y"


def test_bos_and_eos_texts_come_from_the_vocabulary(smollm2_template, gemma3_template):
    # SmolLM2's BOS/EOS are <|im_start|>/<|im_end|> and its tokenizer adds no BOS;
    # Gemma 3's are <bos>/<eos> and its tokenizer adds BOS
    assert (smollm2_template.bos_token, smollm2_template.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert not smollm2_template.add_bos
    assert (gemma3_template.bos_token, gemma3_template.eos_token) == ("<bos>", "<eos>")
    assert gemma3_template.add_bos


def test_chatml_text_and_generation_prompt():
    t = ChatTemplate(None)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U\nline"},
            {"role": "assistant", "content": "A"}]
    body = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU\nline<|im_end|>\n" \
           "<|im_start|>assistant\nA<|im_end|>\n"
    assert t.render(msgs, add_generation_prompt=False) == body
    assert t.render(msgs) == body + "<|im_start|>assistant\n"
    assert t.name == ChatTemplate("chatml").name == ChatTemplate(" chatml\n").name == "chatml"
    assert ChatTemplate.from_metadata({}).name == "chatml"


def test_smollm2_without_generation_prompt(smollm2_template):
    out = smollm2_template.render(USER, add_generation_prompt=False)
    assert out.endswith("<|im_start|>user\nHi<|im_end|>\n")
    assert not out.endswith("<|im_start|>assistant\n")


def test_leading_bos_text_is_removed_when_the_tokenizer_adds_bos():
    src = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}{{ eos_token }}"
    meta = {"tokenizer.chat_template": src, "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.model": "llama"}
    # llama vocabularies add BOS by default, so the template's <s> would be doubled
    assert ChatTemplate.from_metadata(meta).render(USER) == "[Hi]</s>"
    assert ChatTemplate.from_metadata({**meta, "tokenizer.ggml.add_bos_token": False}).render(USER) \
        == "<s>[Hi]</s>"
    assert ChatTemplate.from_metadata({**meta, "tokenizer.ggml.add_eos_token": True}).render(USER) \
        == "[Hi]"
    assert ChatTemplate.from_metadata(meta, add_bos=False).render(USER) == "<s>[Hi]</s>"


def test_bad_token_ids_in_metadata_are_reported():
    with pytest.raises(ChatTemplateError, match="outside the vocabulary"):
        ChatTemplate.from_metadata({"tokenizer.ggml.tokens": ["a"],
                                    "tokenizer.ggml.bos_token_id": 5})


# ---------------------------------------------------------------------------------------------
# the sandbox


@pytest.mark.parametrize("src", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ ''['__class__'] }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ '{0.__class__}'.format('') }}",
    "{{ messages.append({'role': 'x', 'content': 'y'}) }}",
    "{% set d = {} %}{{ d.update({'a': 1}) }}",
    "{% if ().__class__ %}x{% endif %}",
])
def test_hostile_templates_are_blocked(src):
    t = ChatTemplate(src)
    with pytest.raises(ChatTemplateSecurityError) as info:
        t.render(USER)
    assert isinstance(info.value, ChatTemplateError) and isinstance(info.value, ValueError)
    assert "unsafe" in str(info.value)


def test_missing_values_stay_lenient_like_hf():
    # HF templates test optional keys freely; only unsafe attributes are errors
    src = "{% if messages[0]['tool_calls'] %}T{% endif %}{{ messages[0].name }}|" \
          "{% if ''.__class__ is defined %}leak{% endif %}{{ tools }}"
    assert ChatTemplate(src).render(USER) == "|None"


def test_template_errors_are_chat_template_errors():
    broken = ChatTemplate("{% for m in messages %}")  # compiles on first render, not before
    with pytest.raises(ChatTemplateError, match="does not compile.*endfor"):
        broken.render(USER)
    with pytest.raises(ChatTemplateError, match="No filter named 'nosuch'"):
        ChatTemplate("{{ 1 | nosuch }}").render(USER)
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ 1 / 0 }}").render(USER)
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ nothing.here }}").render(USER)


# ---------------------------------------------------------------------------------------------
# helpers HF templates use


def test_raise_exception_carries_the_templates_message():
    src = "{% if messages[0]['role'] != 'system' %}" \
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}" \
          "{% endif %}ok"
    t = ChatTemplate(src)
    with pytest.raises(ChatTemplateError) as info:
        t.render(USER)
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert t.render([{"role": "system", "content": "s"}]) == "ok"


def test_tojson_behaves_like_hf():
    data = {"b": "héllo <tag> & 'q'", "a": [1, 2.5, None, True]}
    t = ChatTemplate("{{ messages[0]['content'] | tojson }}|{{ x | tojson }}|{{ x | tojson(indent=2) }}"
                     "|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(ensure_ascii=true) }}")
    out = t.render([{"role": "user", "content": "ünï"}], x=data).split("|")
    assert out[0] == '"ünï"'
    assert out[1] == json.dumps(data, ensure_ascii=False)  # no HTML escaping, key order kept
    assert out[2] == json.dumps(data, ensure_ascii=False, indent=2)
    assert out[3] == json.dumps(data, ensure_ascii=False, sort_keys=True)
    assert out[4] == json.dumps(data, ensure_ascii=True)


def test_strftime_now():
    t = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}")
    before = datetime.datetime.now().strftime("%Y-%m-%d")
    out = t.render(USER)
    after = datetime.datetime.now().strftime("%Y-%m-%d")
    assert out in (before, after)


def test_trim_blocks_lstrip_blocks_loop_controls_and_generation_blocks():
    src = """{% for m in messages %}
    {% if loop.index > 2 %}{% break %}{% endif %}
<{{ m['role'] }}>{% generation %}{{ m['content'] }}{% endgeneration %};
{% endfor %}"""
    msgs = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"},
            {"role": "user", "content": "3"}]
    # indentation before a block tag and the newline after one are dropped; text newlines stay
    assert ChatTemplate(src).render(msgs) == "<user>1;\n<assistant>2;\n"


def test_variables_extra_keys_and_overrides():
    src = "{{ add_generation_prompt }} {{ enable_thinking }} {{ messages[0]['name'] }} {{ custom }}"
    t = ChatTemplate(src)
    msgs = [{"role": "user", "content": "c", "name": "bob"}]
    assert t.render(msgs) == "True True bob "
    assert t.render(msgs, add_generation_prompt=False, enable_thinking=False, custom=3) == \
        "False False bob 3"


def test_template_cannot_change_the_callers_messages():
    msgs = [{"role": "user", "content": "c"}]
    with pytest.raises(ChatTemplateSecurityError):
        ChatTemplate("{% set _ = messages[0].update({'content': 'x'}) %}").render(msgs)
    assert msgs == [{"role": "user", "content": "c"}]


# ---------------------------------------------------------------------------------------------
# message validation


@pytest.mark.parametrize("messages, match", [
    ("hello", "list"),
    ({"role": "user", "content": "x"}, "list"),
    (None, "list"),
    (["hi"], r"messages\[0\] must be a dict"),
    ([{"content": "x"}], "no 'role'"),
    ([{"role": "user"}], "no 'content'"),
    ([{"role": "", "content": "x"}], "role"),
    ([{"role": 3, "content": "x"}], "role"),
    ([{"role": "user", "content": "x"}, {"role": "user", "content": None}],
     r"messages\[1\]\['content'\] must be a str"),
    ([{"role": "user", "content": ["parts"]}], "content"),
])
def test_invalid_messages_raise_clear_errors(messages, match):
    with pytest.raises(ValueError, match=match):
        ChatTemplate(None).render(messages)


# ---------------------------------------------------------------------------------------------
# llama.cpp's built-in templates

CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello "}, {"role": "user", "content": "Bye"}]

# Written from reading llm_chat_apply_template in llama.cpp's src/llama-chat.cpp (CHAT, with the
# generation prompt where the template has one); libllama's own output is checked below.
READ_FROM_LLAMA_CHAT_CPP = {
    "chatml": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n Hello <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n",
    # no <<SYS>> tags in plain llama2; no generation prompt: the open [INST] turn is it
    "llama2": "[INST] S\nHi [/INST] Hello </s>[INST] Bye [/INST]",
    # contents trimmed
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    # the system text opens the next user turn; "assistant" is "model"; contents trimmed
    "gemma": "<start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nS<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n Hello <|end|>\n"
            "<|user|>\nBye<|end|>\n<|assistant|>\n",
    # a space after each opening tag and before the reply; no generation prompt
    "mistral-v7": "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] Hi[/INST]  Hello </s>[INST] Bye[/INST]",
    "deepseek": "S### Instruction:\nHi\n### Response:\n Hello \n<|EOT|>\n### Instruction:\nBye\n"
                "### Response:\n",
    "deepseek3": "S\n\n<｜User｜>Hi<｜Assistant｜> Hello <｜end▁of▁sentence｜><｜User｜>Bye"
                 "<｜Assistant｜>",
}


@pytest.mark.parametrize("name", sorted(READ_FROM_LLAMA_CHAT_CPP))
def test_builtin_templates_as_read_from_llama_cpp(name):
    assert ChatTemplate(name).render(CHAT) == READ_FROM_LLAMA_CHAT_CPP[name]


def test_every_builtin_template_renders_as_libllama_does(golden_builtin):
    assert CHAT_TEMPLATE_NAMES == tuple(golden_builtin["renders"])  # all of them, same order
    for name, renders in golden_builtin["renders"].items():
        template = ChatTemplate(name)
        for r in renders:
            messages = golden_builtin["conversations"][r["conversation"]]
            assert template.render(messages, r["add_generation_prompt"]) == r["prompt"], \
                (name, messages, r["add_generation_prompt"])


def test_builtin_templates_leave_bos_and_eos_texts_alone():
    # llama.cpp's legacy path writes a built-in template's text as it is
    t = ChatTemplate("monarch", bos_token="<s>", add_bos=True)
    assert t.render(CHAT[:2]) == "system\nS</s>\n<s>user\nHi</s>\n<s>assistant\n"


# ---------------------------------------------------------------------------------------------
# limits: every hostile template ends in a ChatTemplateError within 2 s and 100 MB

HOSTILE = {
    "nested-range-loops": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                           "{% endfor %}{% endfor %}", ChatTemplateLimitError, "ran for more than"),
    "lipsum": ("{{ lipsum(10**6) }}", ChatTemplateLimitError, ""),
    "constant-folded-repeat": ("{{ 'a' * 10**9 }}", ChatTemplateLimitError, "memory"),
    "repeat-1e10": ("{{ 'a' * 10**10 }}", ChatTemplateLimitError, "memory"),
    "list-repeat": ("{{ [1] * 10**9 }}", ChatTemplateLimitError, "memory"),
    "tojson-indent": ("{{ messages | tojson(indent=10**9) }}", ChatTemplateLimitError, "memory"),
    "doubling": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", ChatTemplateLimitError,
                 "memory"),
    "slow-c-call": ("{{ ('b' * 1000000).strip('c' * 1000000 ~ 'b') }}", ChatTemplateLimitError,
                    "ran for more than"),
    "long-prompt": ("{{ 'a' * 5000000 }}", ChatTemplateLimitError, "5,000,000 characters"),
    "30-nested-for": ("{% for a in messages %}" * 30 + "{% endfor %}" * 30, ChatTemplateError,
                      "too deeply for Python \\(too many statically nested blocks"),
    "200-nested-if": ("{% if true %}" * 200 + "{% endif %}" * 200, ChatTemplateError,
                      "too deeply for Python \\(too many levels of indentation"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ChatTemplateError,
                  "recursed too deeply"),
    "inf-to-int": ("{{ (1e308 * 10) | int }}", ChatTemplateError,
                   "OverflowError: cannot convert float infinity to integer"),
}

# Renders each hostile template in a fresh Python, in a worker of its own: the app's peak RSS
# (RUSAGE_SELF) and the workers' (RUSAGE_CHILDREN, the largest child waited for: each case's
# worker is stopped after it) against those of an idle app and worker. The clock runs from the
# render call to its error, with the worker started beforehand (its start is not the template's:
# ~0.1 s on an idle machine, and after a stop the next worker starts at once in the background).
_MEASURE = """
import json, resource, sys, time
from llamatui.inference.chat import sandbox as template_sandbox
from llamatui.inference.chat.template import ChatTemplate, ChatTemplateError
user = [{"role": "user", "content": "Hi"}]
ChatTemplate("{{ 1 }}").render(user)
template_sandbox.shutdown()
def peaks():
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
idle_self, idle_worker = peaks()
for name, source in json.loads(sys.stdin.read()).items():
    ChatTemplate("{{ 1 }}").render(user)
    start = time.perf_counter()
    try:
        ChatTemplate(source).render(user)
        error = None
    except ChatTemplateError as e:
        error = [type(e).__name__, str(e)]
    seconds = time.perf_counter() - start
    template_sandbox.shutdown()
    own, worker = peaks()
    print(json.dumps({"name": name, "error": error, "seconds": seconds,
                      "app_growth_kib": own - idle_self,
                      "worker_growth_kib": worker - idle_worker}))
"""


@pytest.fixture(scope="module")
def hostile_results():
    if sys.platform != "linux":
        pytest.skip("peak memory through getrusage's ru_maxrss in KiB (Linux)")
    # the child imports llamatui as this process does (the same interpreter and environment)
    out = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True,
                         text=True, timeout=120,
                         input=json.dumps({k: v[0] for k, v in HOSTILE.items()}))
    assert out.returncode == 0, out.stderr
    return {r["name"]: r for r in map(json.loads, out.stdout.splitlines())}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_ends_in_an_error_within_2_s_and_100_mb(name, hostile_results):
    _, error_type, message = HOSTILE[name]
    result = hostile_results[name]
    assert result["error"] is not None, f"{name} rendered"
    kinds = {c.__name__: c for c in (ChatTemplateError, ChatTemplateLimitError,
                                      ChatTemplateSecurityError)}
    assert issubclass(kinds[result["error"][0]], error_type), result["error"]
    assert re.search(message, result["error"][1]), result["error"]
    assert result["seconds"] < 2.0
    assert result["worker_growth_kib"] < 100_000 and result["app_growth_kib"] < 100_000, result


def test_a_render_after_a_stopped_one_works():
    endless = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}"
                           "{% endfor %}{% endfor %}")
    start = time.perf_counter()
    with pytest.raises(ChatTemplateLimitError, match="ran for more than 1 s"):
        endless.render(USER)
    assert time.perf_counter() - start < 2.0
    assert ChatTemplate("{{ messages[0].content }}!").render(USER) == "Hi!"


def test_a_render_interrupted_in_its_thread_leaves_no_busy_worker():
    """Ctrl+C (or any exception) in a thread waiting on an endless render: the worker still
    looping on it is stopped, so the next render answers at once instead of timing out."""
    endless = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}"
                           "{% endfor %}{% endfor %}")
    outcome = []

    def render():
        try:
            endless.render(USER)
        except BaseException as e:  # noqa: BLE001 - the injected KeyboardInterrupt
            outcome.append(type(e))

    thread = threading.Thread(target=render)
    thread.start()
    time.sleep(0.3)  # inside the render
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                              ctypes.py_object(KeyboardInterrupt))
    thread.join(5)
    assert outcome == [KeyboardInterrupt]
    start = time.perf_counter()
    assert ChatTemplate("{{ messages[0].content }}!").render(USER) == "Hi!"
    assert time.perf_counter() - start < 0.9  # not the endless render's 1 s timeout


def test_template_variables_must_be_json_values():
    with pytest.raises(ChatTemplateError, match="must be JSON values"):
        ChatTemplate("{{ x }}").render(USER, x=object())
    # JSON values arrive as they were sent (keys keep their order, floats their value)
    assert ChatTemplate("{{ x | tojson }}").render(USER, x={"b": 1.5, "a": [None, True]}) == \
        '{"b": 1.5, "a": [null, true]}'


# ---------------------------------------------------------------------------------------------
# the --chat-template flag (llama.cpp's --chat-template / --chat-template-file)


class _Args:
    def __init__(self, chat_template=None, chat_template_file=None):
        self.chat_template = chat_template
        self.chat_template_file = chat_template_file


def test_chat_template_flag(tmp_path):
    jinja = "{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(jinja, encoding="utf-8")
    assert chat_template_from_args(_Args()) is None
    assert chat_template_from_args(_Args("gemma")) == "gemma"
    assert chat_template_from_args(_Args(jinja)) == jinja
    assert chat_template_from_args(_Args(str(path))) == jinja
    assert chat_template_from_args(_Args(chat_template_file=str(path))) == jinja
    with pytest.raises(ValueError, match="'gemma3' is not a built-in template"):
        chat_template_from_args(_Args("gemma3"))
    with pytest.raises(ValueError, match="cannot read the chat template file"):
        chat_template_from_args(_Args(chat_template_file=str(tmp_path / "missing.jinja")))
