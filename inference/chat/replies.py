"""The reader of one chat reply, chosen for its template: gpt-oss's Harmony channels
(chat.harmony.HarmonyStream), Gemma 4's thought channels and calls (chat.gemma4.Gemma4Stream)
or tagged reasoning and tool calls (chat.tool_calls.ReplyStream, with the template's reasoning
tags from chat.reasoning)."""
from __future__ import annotations

from .gemma4 import Gemma4Stream
from .harmony import HarmonyStream
from .reasoning import ReasoningStyle, prompt_opens_thinking
from .tool_calls import ReplyStream, ToolPlan


def reply_stream(style: ReasoningStyle, plan: ToolPlan | None, reasoning_format: str,
                 prompt_text: str) -> ReplyStream | HarmonyStream | Gemma4Stream:
    """A stream for one choice. reasoning_format "none" leaves reasoning in the content (as
    llama-server's --reasoning-format none); the others (chat.reasoning.REASONING_FORMATS)
    split it out. prompt_text: the rendered prompt (a template that opens the thinking block
    itself leaves the reply inside it)."""
    reasoning = reasoning_format != "none"
    if style.name == "harmony":
        return HarmonyStream(plan, reasoning)
    if style.name == "gemma4":
        return Gemma4Stream(plan, reasoning, prompt_text)
    opened = prompt_opens_thinking(style, prompt_text)
    stream = ReplyStream(plan, reasoning, opened, style)
    if opened and not reasoning and style.name == "qwen3-coder":
        # its parser reads the generation prompt's opening tag as content then
        stream.pending = prompt_text[prompt_text.rfind(style.start):]
    return stream
