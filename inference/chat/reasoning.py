"""How a chat template's model marks its reasoning: the tags around a thinking block, the tokens
its reply must keep as text, and what a reasoning budget forces when it runs out.

llama.cpp decides this per template in common/chat.cpp (common_chat_try_specialized_template,
then the differential autoparser) and hands it to the server as the chat params'
`thinking_start_tag`, `thinking_end_tags` and `preserved_tokens`:

- harmony (gpt-oss, `<|channel|>` in the template): `<|channel|>analysis<|message|>` ... `<|end|>`
  (common/parsers/gpt-oss.cpp; the reply is read by chat.harmony);
- gemma4 (`<|channel>` in the template): `<|channel>thought` ... `<channel|>`, and a thought
  block may follow content again (common/parsers/gemma4.cpp; the reply is read by
  chat.gemma4); its markers are control tokens, which the reply shows only because they are
  preserved;
- qwen3-coder (Qwen 3.5, Qwen3-Coder, Nemotron Nano 3: `<tool_call>` with `<function=` and
  `<parameter=`): `<think>` ... `</think>`, the budget forcing "\\n</think>"
  (common/parsers/qwen3-coder.cpp);
- think (every other template: Qwen 3, DeepSeek R1, ...): `<think>` ... `</think>`.

`trim`: whether reasoning is trimmed at both ends (the autoparser's way) or only its leading
space skipped, as the specialised parsers capture it.
"""
from __future__ import annotations

from dataclasses import dataclass

# llama-server's --reasoning-format / `reasoning_format` values (common_reasoning_format_from_name).
# Every one but "none" splits reasoning out of the content: llama.cpp 11434's parsers test only
# `!= NONE`, so "deepseek-legacy" reads as "deepseek" (the server sets reasoning_in_content for
# it, but no parser reads that flag).
REASONING_FORMATS = ("auto", "deepseek", "deepseek-legacy", "none")


@dataclass(frozen=True)
class ReasoningStyle:
    name: str
    start: str  # the tag that opens a thinking block
    end_tags: tuple[str, ...]  # the tags that close it; the first is what a budget forces
    preserved: tuple[str, ...] = ()  # token texts the reply shows even when they are control
    trim: bool = True
    call_ends: str | None = None  # a tool call's opening tag that also ends thinking

    @property
    def end(self) -> str:
        """The tag a reply's text closes the block with (the forced one, whitespace aside)."""
        return self.end_tags[0].strip()


THINK = ReasoningStyle("think", "<think>", ("</think>",))
QWEN3_CODER = ReasoningStyle("qwen3-coder", "<think>", ("\n</think>", "</think>"),
                            ("<tool_call>", "</tool_call>", "<think>", "</think>"), trim=False,
                            call_ends="<tool_call>")
GEMMA4 = ReasoningStyle("gemma4", "<|channel>thought", ("<channel|>",),
                        ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>"),
                        trim=False)
HARMONY = ReasoningStyle("harmony", "<|channel|>analysis<|message|>", ("<|end|>",),
                         ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"),
                         trim=False)


def reasoning_style(template_source: str | None, builtin: bool = False) -> ReasoningStyle:
    """The style of a chat template, tested in common_chat_try_specialized_template's order
    (a built-in template is treated as plain <think>, as llama.cpp's legacy path)."""
    src = "" if builtin or not template_source else template_source
    if "<|channel|>" in src and "chat_format=llm-jp-harmony-v1" not in src:
        return HARMONY
    if "<|channel>" in src:
        return GEMMA4
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src and \
            "<think>" in src:
        return QWEN3_CODER
    return THINK


def prompt_opens_thinking(style: ReasoningStyle, prompt_text: str) -> bool:
    """Whether a rendered prompt leaves the model inside a thinking block (Qwen 3 and 3.5,
    DeepSeek R1 templates open it themselves: llama.cpp's generation prompt ends with it)."""
    return style.name != "harmony" and prompt_text.rstrip().endswith(style.start)


# ------------------------------------------------------------------------ the budget

class _Matcher:
    """Which of some token sequences ends at each token fed (common/reasoning-budget.cpp's
    token_matcher: the longest; the state resets after a match)."""

    def __init__(self, seqs: list[list[int]]):
        self.seqs = [list(s) for i, s in enumerate(seqs) if s and s not in seqs[:i]]
        self.longest = max((len(s) for s in self.seqs), default=0)
        self.recent: list[int] = []

    def advance(self, token: int) -> int:
        self.recent = (self.recent + [token])[-self.longest:] if self.longest else []
        best = -1
        for i, seq in enumerate(self.seqs):
            if self.recent[-len(seq):] == seq and (best < 0 or len(seq) > len(self.seqs[best])):
                best = i
        if best >= 0:
            self.recent = []
        return best

    def reset(self) -> None:
        self.recent = []


def _utf8_complete(piece: bytes) -> bool:
    """Whether a token's piece does not end inside a UTF-8 character (common/unicode.cpp's
    common_utf8_is_complete: only the piece itself is looked at)."""
    if not piece:
        return True
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:
            return back >= (4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0
                            else 1)
    return False


class ReasoningBudget:
    """llama.cpp's reasoning-budget sampler (common/reasoning-budget.cpp), for one request: once
    the start tag's tokens are generated (or sit in the generation prompt) it counts the
    thinking tokens; when `budget` of them are spent (at once for 0) and the last one completed
    its UTF-8 character, it forces `forced` (--reasoning-budget-message's tokens, then the first
    end tag's) one token at a time; an end tag the model writes itself ends the count. A later
    start tag re-arms it.

    The scheduler asks `forced_token()` before sampling (a token id: take it, no sampling) and
    feeds every generated token to `accept`."""

    IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = range(5)

    def __init__(self, start: list[int], ends: list[list[int]], forced: list[int], budget: int,
                 piece=None, prefill: list[int] = ()):
        """piece(token id) -> bytes (without special tokens), for the UTF-8 check; prefill:
        the generation prompt's tokens, accepted first as llama.cpp does."""
        if not start or not forced:
            raise ValueError("a reasoning budget needs a start tag and tokens to force")
        self.start, self.end = _Matcher([start]), _Matcher(ends)
        self.forced = list(forced)
        self.budget = self.remaining = int(budget)
        self.piece = piece
        self.state, self.force_pos = self.IDLE, 0
        for token in prefill:
            self.accept(token)

    def forced_token(self) -> int | None:
        if self.state == self.FORCING and self.force_pos < len(self.forced):
            return self.forced[self.force_pos]
        return None

    def accept(self, token: int) -> None:
        if self.state in (self.IDLE, self.DONE):
            if self.start.advance(token) >= 0:
                self._arm()
        elif self.state in (self.COUNTING, self.WAITING_UTF8):
            if self.end.advance(token) >= 0:
                self.state = self.DONE
                return
            complete = self.piece is None or _utf8_complete(self.piece(token))
            if self.state == self.WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = self.WAITING_UTF8
                        self.end.reset()
        elif self.state == self.FORCING:
            self.end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = self.DONE

    def _arm(self) -> None:
        self.state, self.remaining = self.COUNTING, self.budget
        self.end.reset()
        if self.remaining <= 0:
            self.state, self.force_pos = self.FORCING, 0

    def _force(self) -> None:
        self.state, self.force_pos = self.FORCING, 0
        self.end.reset()
