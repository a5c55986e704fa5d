"""Chat templates: llama.cpp's prompts for both starter models, the sandbox, HF's helpers."""
import datetime
import json

import pytest

from llamatui.inference.chat_template import (
    CHATML_TEMPLATE, ChatTemplate, ChatTemplateError, ChatTemplateSecurityError)
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


# ---------------------------------------------------------------------------------------------
# llama.cpp's prompts


def test_smollm2_prompts_equal_llama_cpp(smollm2_template, golden_smollm2):
    cases = golden_smollm2["chat_template"]
    assert cases
    assert not smollm2_template.is_chatml_fallback
    for case in cases:
        assert smollm2_template.render(case["messages"]) == case["prompt"]


def test_gemma3_without_template_falls_back_to_chatml_like_llama_cpp(gemma3_template,
                                                                     golden_gemma3):
    cases = golden_gemma3["chat_template"]
    assert cases
    assert gemma3_template.is_chatml_fallback
    for case in cases:
        assert gemma3_template.render(case["messages"]) == case["prompt"]


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
    assert ChatTemplate("chatml").is_chatml_fallback
    assert ChatTemplate.from_metadata({}).source == CHATML_TEMPLATE


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
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
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
