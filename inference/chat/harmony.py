"""gpt-oss's Harmony format: a reply read back into reasoning, content and tool calls.

A gpt-oss prompt ends with `<|start|>assistant` and the model writes one or more messages, each a
header, `<|message|>`, a body and `<|end|>` (the last one ends with the end-of-generation tokens
`<|return|>` or `<|call|>` instead, which never reach the text):

    <|channel|>analysis<|message|>Let me think.<|end|>
    <|start|>assistant<|channel|>final<|message|>The answer.
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

llama.cpp reads it with common/parsers/gpt-oss.cpp (common_chat_params_init_gpt_oss, a PEG
parser of COMMON_CHAT_FORMAT_PEG_NATIVE); `HarmonyStream` reads it the same way, as it arrives:

- the `analysis` channel is `reasoning_content` (with --reasoning-format none: content, its
  markers `<|channel|>analysis<|message|>...<|end|>` kept);
- a `commentary` message without a recipient (a preamble) and the `final` channel are content;
- a message to `functions.NAME` (in the channel header or the role header) is a tool call whose
  arguments are the body; a message to any other recipient (a built-in tool the request did not
  offer) is dropped, as llama.cpp's "unsolicited" rule consumes it;
- a stray `<|channel|>commentary to=assistant` before the real channel is skipped.

The stream gives the same deltas as tool_calls.ReplyStream (`reasoning_content`, `content`,
`tool_calls` with index, id, type and name first, then arguments in fragments) and the same
`message()`.
"""
from __future__ import annotations

import re

from .tool_calls import ReplyText, ToolCall, ToolPlan, _partial_suffix

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ANALYSIS_OPEN = CHANNEL + "analysis" + MESSAGE  # llama.cpp's thinking_start_tag for gpt-oss
# the tokens llama.cpp keeps in gpt-oss's output text (its preserved_tokens)
PRESERVED_TOKENS = ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z0-9_-]+)")


def is_harmony(template_source: str | None) -> bool:
    """common_chat_try_specialized_template's test for gpt-oss: `<|channel|>` in the template
    (after LLM-jp's Harmony dialect, which announces itself)."""
    return bool(template_source) and CHANNEL in template_source and \
        "chat_format=llm-jp-harmony-v1" not in template_source


def harmony_messages(messages: list[dict]) -> list[dict]:
    """The history as gpt-oss's template wants it (common_chat_params_init_gpt_oss): an
    assistant's `reasoning_content` becomes `thinking`, and with tool calls its `content` goes
    (the template refuses both content and thinking on a tool-calling message)."""
    out = []
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


class HarmonyStream(ReplyText):
    """One choice's gpt-oss reply turned into OpenAI chat deltas as its text arrives (the
    interface of tool_calls.ReplyStream: feed, finish, message, calls)."""

    def __init__(self, plan: ToolPlan | None, reasoning: bool):
        self.plan = plan if plan is not None and plan.active else None
        self.reasoning = reasoning
        self.pending = ""
        self.header: str | None = ""  # the current message's header; None inside a body
        self.kind = ""  # the body being read: "reasoning", "content", "raw", "call", "drop"
        self.content = ""
        self.thought: str | None = "" if reasoning else None
        self.calls: list[ToolCall] = []

    # ------------------------------------------------------------------ reading

    def feed(self, text: str) -> list[dict]:
        self.pending += text
        deltas: list[dict] = []
        while self.pending:
            before = self.pending
            deltas += self._step()
            if self.pending == before:
                break
        return deltas

    def _step(self) -> list[dict]:
        if self.header is not None:
            return self._read_header()
        return self._read_body()

    def _read_header(self) -> list[dict]:
        """Everything up to `<|message|>` (the role header `<|start|>assistant ...` of a later
        message included) is the header; none of it is shown."""
        text = self.header + self.pending
        i = text.find(MESSAGE)
        if i < 0:
            self.header, self.pending = text, ""
            return []
        self.header, self.pending = None, text[i + len(MESSAGE):]
        return self._open(text[:i])

    def _open(self, header: str) -> list[dict]:
        """A message's header is complete: what its body is."""
        channels = _CHANNEL_NAME.findall(header)
        channel = channels[-1] if channels else ""
        recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
        if recipients:
            name = recipients[-1]
            if self.plan is None or not name.startswith("functions."):
                self.kind = "drop"
                return []
            call = ToolCall(name[len("functions."):], "")
            self.calls.append(call)
            self.kind = "call"
            first = call.openai(len(self.calls) - 1)
            return [{"tool_calls": [first]}]
        if channel == "analysis":
            if self.reasoning:
                self.kind = "reasoning"
                return []
            self.kind = "raw"  # llama.cpp keeps the channel header, not the role's
            return self._out("content", header.lstrip().removeprefix(START + "assistant")
                             + MESSAGE)
        self.kind = "content"  # final, or a commentary preamble
        return []

    def _read_body(self) -> list[dict]:
        text = self.pending
        i = text.find(END)
        if i >= 0:
            body, self.pending = text[:i], text[i + len(END):]
            deltas = self._body(body)
            if self.kind == "raw":
                deltas += self._out("content", END)
            self.header, self.kind = "", ""
            return deltas
        keep = _partial_suffix(text, END)
        self.pending = text[len(text) - keep:] if keep else ""
        return self._body(text[:len(text) - keep])

    def _body(self, text: str) -> list[dict]:
        if not text or self.kind == "drop":
            return []
        if self.kind == "call":
            call = self.calls[-1]
            call.arguments += text
            return [{"tool_calls": [{"index": len(self.calls) - 1,
                                     "function": {"arguments": text}}]}]
        return self._out("reasoning_content" if self.kind == "reasoning" else "content", text)

    # ------------------------------------------------------------------ the end

    def finish(self) -> list[dict]:
        """What is still owed at the end: a body's held-back text, or a header that never
        reached `<|message|>` (plain text from a model that wrote no header: content)."""
        deltas: list[dict] = []
        rest, self.pending = self.pending, ""
        if self.header is None:
            deltas += self._body(rest)
        else:
            header = (self.header or "") + rest
            if header.strip() and not any(m in header for m in (START, CHANNEL, "to=")):
                deltas += self._out("content", header)
            self.header = ""
        for call in self.calls:
            call.arguments = call.arguments.strip()
        return deltas

    def message(self) -> dict:
        """The whole reply as an OpenAI message (after finish), as tool_calls.ReplyStream."""
        content = self.content.strip() if self.calls else self.content
        msg = {"role": "assistant", "content": content if content or not self.calls else None}
        if self.thought:  # as llama.cpp's parser captured it (not trimmed)
            msg["reasoning_content"] = self.thought
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg


def parse_harmony(text: str, plan: ToolPlan | None = None, reasoning: bool = True) -> dict:
    """A whole gpt-oss reply (the text after the prompt's `<|start|>assistant`) as an OpenAI
    message."""
    stream = HarmonyStream(plan, reasoning)
    stream.feed(text)
    stream.finish()
    return stream.message()

