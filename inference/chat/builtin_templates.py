"""llama.cpp's built-in chat templates, chosen by name (`--chat-template gemma`).

These follow `llm_chat_apply_template` in llama.cpp's src/llama-chat.cpp: plain string building,
no Jinja, the text llama.cpp produces for a name from `llama_chat_builtin_templates` (its
"legacy" path, which `common_chat_templates_apply_legacy` takes for a built-in name). They are
what a model without a Jinja template of its own is spoken to in, so they must match byte for
byte: tests/golden/llama_cpp_chat_builtin.json holds libllama's own renderings.

What llama.cpp does and a Jinja template would not, kept on purpose:
- a BOS/EOS text written by a template (`<s>` in monarch, gigachat, llama2-sys-bos) stays;
- some templates ignore add_generation_prompt (llama2, mistral, orion, minicpm, rwkv-world, ...);
- "trim" strips only C's isspace characters (space, \\t, \\n, \\v, \\f, \\r);
- roles a template does not know are dropped by some, written as-is by others.

Most templates give each message one piece of text chosen by its role (`_Turns`); the few that
carry state from message to message (a system prompt merged into the next turn, a turn that
stays open) are functions.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["BUILTIN_TEMPLATES", "BuiltinTemplate", "CHAT_TEMPLATE_NAMES"]

Messages = Sequence[Mapping[str, str]]

_C_SPACE = " \t\n\v\f\r"


def _trim(text: str) -> str:
    """llama-chat.cpp's trim(): C isspace only (Python's strip() would also take e.g. \\x1c)."""
    return text.strip(_C_SPACE)


def _ascii_upper(text: str) -> str:
    """C's toupper() byte by byte in the "C" locale: only ASCII letters change."""
    return "".join(c.upper() if c.isascii() else c for c in text)


@dataclass(frozen=True)
class BuiltinTemplate:
    """A built-in template: `render(messages, add_generation_prompt)` gives the prompt text.
    `end_of_turn` is the text that closes a reply, where the template has one: the engine stops
    at it when the vocabulary has no token for it (a model prompted in a format it lacks)."""
    name: str
    render: Callable[[Messages, bool], str] = field(repr=False)
    end_of_turn: str | None = None


@dataclass(frozen=True)
class _Turns:
    """Each message becomes `turns[role]` (else `turns["*"]`; a role in neither is dropped) with
    {role}, {Role} (first letter upper), {ROLE} (upper) and {content} filled in; then `reply`
    when a generation prompt is asked for."""
    turns: Mapping[str, str]
    reply: str = ""
    prefix: str = ""
    trim: bool | Collection[str] = False  # True: every message's content; or these roles'

    def __call__(self, messages: Messages, add_generation_prompt: bool) -> str:
        out = [self.prefix]
        for m in messages:
            role, content = m["role"], m["content"]
            turn = self.turns.get(role, self.turns.get("*"))
            if turn is None:
                continue
            if self.trim is True or (self.trim and role in self.trim):
                content = _trim(content)
            out.append(turn.format(role=role, Role=_ascii_upper(role[:1]) + role[1:],
                                   ROLE=_ascii_upper(role), content=content))
        if add_generation_prompt:
            out.append(self.reply)
        return "".join(out)


# ------------------------------------------------------------------------------------------------
# templates with state across messages


def _llama2(system_tags: bool, bos_in_history: bool = False, strip: bool = False):
    """Llama 2 and its variants: one open [INST] turn that the assistant's reply closes;
    system text goes into the open turn (in <<SYS>> tags where the variant knows them)."""
    def render(messages: Messages, add_generation_prompt: bool) -> str:
        out = ["[INST] "]
        inside_turn = True  # the opening [INST] is written already, without a BOS
        for m in messages:
            role = m["role"]
            content = _trim(m["content"]) if strip else m["content"]
            if not inside_turn:
                out.append("<s>[INST] " if bos_in_history else "[INST] ")
                inside_turn = True
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system_tags else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside_turn = False
        return "".join(out)
    return render


def _mistral(leading: str, trailing: str, trim_reply: bool):
    """Mistral v1/v3/v3-tekken: system and user text share one [INST] turn."""
    def render(messages: Messages, add_generation_prompt: bool) -> str:
        out = []
        inside_turn = False
        for m in messages:
            if not inside_turn:
                out.append(f"{leading}[INST]{trailing}")
                inside_turn = True
            role, content = m["role"], m["content"]
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(f"{content}{leading}[/INST]")
            else:
                out.append(trailing + (_trim(content) if trim_reply else content) + "</s>")
                inside_turn = False
        return "".join(out)
    return render


def _gemma(messages: Messages, add_generation_prompt: bool) -> str:
    """Gemma has no system role: system text (trimmed, concatenated) opens the next turn that is
    not the model's; "assistant" is called "model"."""
    out = []
    system = ""
    for m in messages:
        role = m["role"]
        if role == "system":
            system += _trim(m["content"])
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _orion(messages: Messages, add_generation_prompt: bool) -> str:
    """OrionStarAI/Orion-14B-Chat: system text goes into the next user turn."""
    out = []
    system = ""
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system":
            system += content
        elif role == "user":
            out.append("Human: ")
            if system:
                out.append(system + "\n\n")
                system = ""
            out.append(content + "\n\nAssistant: </s>")
        else:
            out.append(content + "</s>")
    return "".join(out)


def _monarch(messages: Messages, add_generation_prompt: bool) -> str:
    """mlabonne/AlphaMonarch-7B: every message but the first starts with a BOS text."""
    out = [("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n"
           for i, m in enumerate(messages)]
    if add_generation_prompt:
        out.append("<s>assistant\n")
    return "".join(out)


def _gigachat(messages: Messages, add_generation_prompt: bool) -> str:
    """GigaChat: a leading system message is part of the opening <s> line."""
    has_system = bool(messages) and messages[0]["role"] == "system"
    out = ["<s>" + (messages[0]["content"] + "<|message_sep|>" if has_system else "")]
    for m in messages[1 if has_system else 0:]:
        if m["role"] == "user":
            out.append(f"user<|role_sep|>{m['content']}<|message_sep|>"
                       "available functions<|role_sep|>[]<|message_sep|>")
        elif m["role"] == "assistant":
            out.append(f"assistant<|role_sep|>{m['content']}<|message_sep|>")
    if add_generation_prompt:
        out.append("assistant<|role_sep|>")
    return "".join(out)


def _unless_first_is_system(prefix: str, turns: _Turns, *, if_empty: bool):
    """`turns`, preceded by `prefix` when the conversation does not open with a system message
    (bailing2's default "detailed thinking off", pangu's empty system turn); `if_empty`: also
    when there are no messages (bailing2 yes, pangu no)."""
    def render(messages: Messages, add_generation_prompt: bool) -> str:
        wanted = messages[0]["role"] != "system" if messages else if_empty
        return (prefix if wanted else "") + turns(messages, add_generation_prompt)
    return render


def _rwkv_world(messages: Messages, add_generation_prompt: bool) -> str:
    """RWKV World: the reply prompt follows a final user message (whatever add_ass says)."""
    out = []
    for i, m in enumerate(messages):
        role, content = m["role"], _trim(m["content"])
        if role == "system":
            out.append(f"System: {content}\n\n")
        elif role == "user":
            out.append(f"User: {content}\n\n")
            if i == len(messages) - 1:
                out.append("Assistant:")
        elif role == "assistant":
            out.append(f"Assistant: {content}\n\n")
    return "".join(out)


def _hunyuan_dense(messages: Messages, add_generation_prompt: bool) -> str:
    """tencent/Hunyuan-4B-Instruct: only a first system message is kept."""
    out = []
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        if role == "assistant":
            out.append(f"<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>")
        elif role == "user":
            out.append(f"<｜hy_User｜>{content}<｜hy_Assistant｜>")
    return "".join(out)


def _hunyuan_vl(messages: Messages, add_generation_prompt: bool) -> str:
    """tencent/HunyuanOCR and HunyuanVL: the role marker follows the content."""
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        elif role == "user":
            out.append(content + "<｜hy_User｜>")
        elif role == "assistant":
            out.append(content + "<｜hy_Assistant｜>")
    return "".join(out)


# ------------------------------------------------------------------------------------------------
# the table


def _roles(system: str, user: str, assistant: str, **others: str) -> dict[str, str]:
    return {"system": system, "user": user, "assistant": assistant, **others}


_CHATML = _Turns({"*": "<|im_start|>{role}\n{content}<|im_end|>\n"}, "<|im_start|>assistant\n")
_GRANITE_4 = _Turns({"assistant_tool_call": "<|start_of_role|>assistant<|end_of_role|><|tool_call|>"
                                            "{content}<|end_of_text|>\n",
                     "*": "<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n"},
                    "<|start_of_role|>assistant<|end_of_role|>")
_VICUNA = dict(user="USER: {content}\n", assistant="ASSISTANT: {content}</s>\n")
_EXAONE = dict(system="[|system|]{content}[|endofturn|]\n", user="[|user|]{content}\n",
               assistant="[|assistant|]{content}[|endofturn|]\n")
_BAILING = {"user": "<role>HUMAN</role>{content}", "*": "<role>{ROLE}</role>{content}"}
_DEEPSEEK_END = "<｜end▁of▁sentence｜>"

_RENDERERS: dict[str, tuple[Callable[[Messages, bool], str], str | None]] = {
    "bailing": (_Turns(_BAILING, "<role>ASSISTANT</role>"), None),
    "bailing-think": (_Turns(_BAILING, "<role>ASSISTANT</role><think>"), None),
    "bailing2": (_unless_first_is_system(
        "<role>SYSTEM</role>detailed thinking off<|role_end|>",
        _Turns({"user": "<role>HUMAN</role>{content}<|role_end|>",
                "*": "<role>{ROLE}</role>{content}<|role_end|>"}, "<role>ASSISTANT</role>"),
        if_empty=True),
        "<|role_end|>"),
    "chatglm3": (_Turns({"*": "<|{role}|>\n {content}"}, "<|assistant|>", prefix="[gMASK]sop"),
                 None),
    "chatglm4": (_Turns({"*": "<|{role}|>\n{content}"}, "<|assistant|>\n",
                        prefix="[gMASK]<sop>"), None),
    "chatml": (_CHATML, "<|im_end|>"),
    "command-r": (_Turns(_roles("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{content}"
                                "<|END_OF_TURN_TOKEN|>",
                                "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{content}"
                                "<|END_OF_TURN_TOKEN|>",
                                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{content}"
                                "<|END_OF_TURN_TOKEN|>"),
                         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=True),
                  "<|END_OF_TURN_TOKEN|>"),
    "deepseek": (_Turns(_roles("{content}", "### Instruction:\n{content}\n",
                               "### Response:\n{content}\n<|EOT|>\n"), "### Response:\n"),
                 "<|EOT|>"),
    "deepseek-ocr": (_Turns({"*": "{content}"}), None),
    "deepseek2": (_Turns(_roles("{content}\n\n", "User: {content}\n\n",
                                "Assistant: {content}" + _DEEPSEEK_END), "Assistant:"),
                  _DEEPSEEK_END),
    "deepseek3": (_Turns(_roles("{content}\n\n", "<｜User｜>{content}",
                                "<｜Assistant｜>{content}" + _DEEPSEEK_END), "<｜Assistant｜>"),
                  _DEEPSEEK_END),
    "exaone-moe": (_Turns({r: "<|" + r + "|>\n{content}<|endofturn|>\n"
                           for r in ("system", "user", "assistant", "tool")},
                          "<|assistant|>\n", trim=True), "<|endofturn|>"),
    "exaone3": (_Turns(_EXAONE, "[|assistant|]", trim=True), "[|endofturn|]"),
    "exaone4": (_Turns({**_EXAONE, "tool": "[|tool|]{content}[|endofturn|]\n"}, "[|assistant|]",
                       trim=True), "[|endofturn|]"),
    "falcon3": (_Turns({"*": "<|{role}|>\n{content}\n"}, "<|assistant|>\n"), None),
    "gemma": (_gemma, "<end_of_turn>"),
    "gigachat": (_gigachat, "<|message_sep|>"),
    "glmedge": (_Turns({"*": "<|{role}|>\n{content}"}, "<|assistant|>"), None),
    "gpt-oss": (_Turns({"assistant": "<|start|>assistant<|message|>{content}<|return|>",
                        "*": "<|start|>{role}<|message|>{content}<|end|>"}, "<|start|>assistant"),
                "<|return|>"),
    "granite": (_Turns({"assistant_tool_call": "<|start_of_role|>assistant_tool_call"
                                               "<|end_of_role|><|tool_call|>{content}"
                                               "<|end_of_text|>\n",
                        "*": "<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n"},
                       "<|start_of_role|>assistant<|end_of_role|>"), "<|end_of_text|>"),
    "granite-4.0": (_GRANITE_4, "<|end_of_text|>"),
    "granite-4.1": (_GRANITE_4, "<|end_of_text|>"),
    "grok-2": (_Turns(_roles("System: {content}<|separator|>\n\n",
                             "Human: {content}<|separator|>\n\n",
                             "Assistant: {content}<|separator|>\n\n"), "Assistant:",
                      trim=("system", "user")), "<|separator|>"),
    "hunyuan-dense": (_hunyuan_dense, "<｜hy_place▁holder▁no▁2｜>"),
    "hunyuan-moe": (_Turns({"system": "<|startoftext|>{content}<|extra_4|>",
                            "assistant": "{content}<|eos|>",
                            "*": "<|startoftext|>{content}<|extra_0|>"}), "<|eos|>"),
    "hunyuan-vl": (_hunyuan_vl, None),
    "kimi-k2": (_Turns({**_roles("<|im_system|>system<|im_middle|>{content}<|im_end|>",
                                 "<|im_user|>user<|im_middle|>{content}<|im_end|>",
                                 "<|im_assistant|>assistant<|im_middle|>{content}<|im_end|>",
                                 tool="<|im_system|>tool<|im_middle|>{content}<|im_end|>"),
                        "*": "{content}<|im_end|>"},
                       "<|im_assistant|>assistant<|im_middle|>"), "<|im_end|>"),
    "llama2": (_llama2(system_tags=False), "</s>"),
    "llama2-sys": (_llama2(system_tags=True), "</s>"),
    "llama2-sys-bos": (_llama2(system_tags=True, bos_in_history=True), "</s>"),
    "llama2-sys-strip": (_llama2(system_tags=True, strip=True), "</s>"),
    "llama3": (_Turns({"*": "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"},
                      "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True),
               "<|eot_id|>"),
    "llama4": (_Turns({"*": "<|header_start|>{role}<|header_end|>\n\n{content}<|eot|>"},
                      "<|header_start|>assistant<|header_end|>\n\n", trim=True), "<|eot|>"),
    "megrez": (_Turns({"*": "<|role_start|>{role}<|role_end|>{content}<|turn_end|>"},
                      "<|role_start|>assistant<|role_end|>"), "<|turn_end|>"),
    "minicpm": (_Turns({"user": "<用户>{content}<AI>", "*": "{content}"}, trim=True), None),
    "mistral-v1": (_mistral(" ", " ", trim_reply=False), "</s>"),
    "mistral-v3": (_mistral("", " ", trim_reply=True), "</s>"),
    "mistral-v3-tekken": (_mistral("", "", trim_reply=False), "</s>"),
    "mistral-v7": (_Turns({"system": "[SYSTEM_PROMPT] {content}[/SYSTEM_PROMPT]",
                           "user": "[INST] {content}[/INST]", "*": " {content}</s>"}), "</s>"),
    "mistral-v7-tekken": (_Turns({"system": "[SYSTEM_PROMPT]{content}[/SYSTEM_PROMPT]",
                                  "user": "[INST]{content}[/INST]", "*": "{content}</s>"}),
                          "</s>"),
    "monarch": (_monarch, "</s>"),
    "openchat": (_Turns({"system": "{content}<|end_of_turn|>",
                         "*": "GPT4 Correct {Role}: {content}<|end_of_turn|>"},
                        "GPT4 Correct Assistant:"), "<|end_of_turn|>"),
    "orion": (_orion, "</s>"),
    "pangu-embedded": (_unless_first_is_system(
        "[unused9]系统：[unused10]",
        _Turns({"system": "[unused9]系统：{content}[unused10]",
                "user": "[unused9]用户：{content}[unused10]",
                "assistant": "[unused9]助手：{content}[unused10]",
                "tool": "[unused9]工具：{content}[unused10]",
                "function": "[unused9]方法：{content}[unused10]"}, "[unused9]助手："),
        if_empty=False),
        "[unused10]"),
    "phi3": (_Turns({"*": "<|{role}|>\n{content}<|end|>\n"}, "<|assistant|>\n"), "<|end|>"),
    "phi4": (_Turns({"*": "<|im_start|>{role}<|im_sep|>{content}<|im_end|>"},
                    "<|im_start|>assistant<|im_sep|>"), "<|im_end|>"),
    "rwkv-world": (_rwkv_world, None),
    "seed_oss": (_Turns({"*": "<seed:bos>{role}\n{content}<seed:eos>"}, "<seed:bos>assistant\n",
                        trim=("assistant",)), "<seed:eos>"),
    "smolvlm": (_Turns({"system": "{content}\n\n", "user": "User: {content}<end_of_utterance>\n",
                        "*": "Assistant: {content}<end_of_utterance>\n"}, "Assistant:",
                       prefix="<|im_start|>"), "<end_of_utterance>"),
    "solar-open": (_Turns({"*": "<|begin|>{role}<|content|>{content}<|end|>"},
                          "<|begin|>assistant"), "<|end|>"),
    "vicuna": (_Turns({"system": "{content}\n\n", **_VICUNA}, "ASSISTANT:"), "</s>"),
    "vicuna-orca": (_Turns({"system": "SYSTEM: {content}\n", **_VICUNA}, "ASSISTANT:"), "</s>"),
    "yandex": (_Turns({"user": " Пользователь: {content}\n\n",
                       "assistant": " Ассистент: {content}\n\n"}, " Ассистент:[SEP]"), None),
    "zephyr": (_Turns({"*": "<|{role}|>\n{content}<|endoftext|>\n"}, "<|assistant|>\n"),
               "<|endoftext|>"),
}

BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {
    name: BuiltinTemplate(name, render, end) for name, (render, end) in _RENDERERS.items()}

# in llama.cpp's order (llama_chat_builtin_templates lists its std::map: sorted by name)
CHAT_TEMPLATE_NAMES: tuple[str, ...] = tuple(sorted(BUILTIN_TEMPLATES))
