"""Gemma 4's replies: thought channels, content and tool calls, read as they arrive.

A Gemma 4 reply (after the prompt's `<|turn>model\\n`) is a run of messages, each an optional
thought `<|channel>thought ... <channel|>` and then content, and then its tool calls:

    <|channel>thought\\nThe user wants weather.<channel|>Let me check.
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>

A call's arguments are Gemma's own notation: keys bare, strings between `<|"|>` markers, numbers,
`true` / `false` / `null`, `{...}` and `[...]`. llama.cpp reads the reply with the PEG parser
of common/parsers/gemma4.cpp (common_chat_params_init_gemma4) and turns the arguments into JSON
with gemma4_to_json (common/chat-peg-parser.cpp); `Gemma4Stream` reads it the same way:

- thought text is `reasoning_content` (with --reasoning-format none: content, markers kept);
  empty `<|channel>` markers before a thought are dropped, a thought may come back after content;
- content runs to the next `<|channel>`, a lone `<channel|>` (after which nothing is content:
  with tools the reply skips to its first call, without them it ends) or `<|tool_call>`;
- calls must follow each other directly, name one of the offered tools, and parse; the first
  that does not ends them (it and what follows are dropped), as does a second call when
  parallel calls are off. A reply cut short keeps its last call's arguments as far as they go.

The stream gives the same deltas as tool_calls.ReplyStream: a call's first delta (index, id,
type, name) once its name is complete, then its arguments' JSON as it grows.
"""
from __future__ import annotations

import json
import re

from .tool_calls import ReplyText, ToolCall, ToolPlan, _partial_suffix

CHANNEL, CHANNEL_END, THOUGHT = "<|channel>", "<channel|>", "thought"
CALL, CALL_END, CALL_HEAD, QUOTE = "<|tool_call>", "<tool_call|>", "<|tool_call>call:", '<|"|>'
TURN = "<|turn>model\n"  # the generation prompt
NO_THINKING = CHANNEL + THOUGHT + "\n" + CHANNEL_END  # what it adds with thinking off
SPACE = " \t\n\v\f\r"  # std::isspace, as the PEG parser's space()
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_GOES_ON = "0123456789.eE+-"
_NUMBER_SO_FAR = re.compile(r"[0-9.eE+-]+")  # a number the text's end cut short


class _NoMatch(Exception):
    """The text cannot be a call."""


class _Arguments:
    """One call's arguments (a Gemma 4 dict from `pos` of `text`) as JSON text, following
    gemma4_to_json: at the end of the text (a call still arriving, or a reply cut short) the
    JSON stops where the text does (`partial`), minus a half-written `<|"|>`."""

    def __init__(self, text: str, pos: int):
        self.text, self.pos, self.out, self.partial = text, pos, [], False

    def read(self) -> tuple[str, int]:
        """The JSON so far and the index after the dict; _NoMatch when it is not one."""
        try:
            self._dict()
        except _End:
            self.partial = True
        return "".join(self.out), self.pos

    def _peek(self) -> str:
        if self.pos >= len(self.text):
            raise _End
        return self.text[self.pos]

    def _literal(self, word: str, shown: bool = False) -> None:
        """`word` (appended to the JSON when `shown`; cut short by the text's end, as far as
        it goes: `tr` for true)."""
        rest = self.text[self.pos:self.pos + len(word)]
        if not word.startswith(rest):
            raise _NoMatch
        if shown:
            self.out.append(rest)
        self.pos += len(rest)
        if rest == word:
            return
        self.pos = len(self.text)  # the text ends inside it
        raise _End

    def _space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in SPACE:
            self.pos += 1

    def _dict(self) -> None:
        self._members("{", "}", self._pair)

    def _array(self) -> None:
        self._members("[", "]", self._value)

    def _members(self, open_: str, close: str, member) -> None:
        """`{` space (`}` | member ("," space member)* space `}`), and the same for arrays."""
        self._literal(open_, True)
        self._space()
        if self._peek() == close:
            self.pos += 1
            self.out.append(close)
            return
        while True:
            member()
            if self._peek() == ",":
                self.pos += 1
                self.out.append(",")
                self._space()
                continue
            self._space()
            self._literal(close, True)
            return

    def _pair(self) -> None:
        """key `:` space value; the key is any text up to the colon ([^:}]+)."""
        end = self.pos
        while end < len(self.text) and self.text[end] not in ":}":
            end += 1
        if end == self.pos:
            self._peek()  # the text's end: nothing of the key yet
            raise _NoMatch
        self.out.append('"' + _escape(self.text[self.pos:end]))
        self.pos = end
        if self._peek() != ":":
            raise _NoMatch
        self.pos += 1
        self.out.append('":')
        self._space()
        self._value()

    def _value(self) -> None:
        ch = self._peek()
        if ch == "<":
            self._string()
        elif ch == "{":
            self._dict()
        elif ch == "[":
            self._array()
        elif ch in "-0123456789":
            self._number()
        else:
            word = {"t": "true", "f": "false", "n": "null"}.get(ch)
            if word is None:
                raise _NoMatch
            self._literal(word, True)

    def _string(self) -> None:
        self._literal(QUOTE)
        end = self.text.find(QUOTE, self.pos)
        if end < 0:  # still being written: keep back what may be the closing marker
            body = self.text[self.pos:]
            body = body[:len(body) - _partial_suffix(body, QUOTE)]
            self.out.append('"' + _escape(body))
            self.pos = len(self.text)
            raise _End
        self.out.append('"' + _escape(self.text[self.pos:end]) + '"')
        self.pos = end + len(QUOTE)

    def _number(self) -> None:
        """A JSON number that the next character cannot extend (json_number's lookahead); at
        the text's end, what there is of one ("-", "2.")."""
        m = _NUMBER.match(self.text, self.pos)
        end = m.end() if m else self.pos
        if end < len(self.text) and self.text[end] not in _NUMBER_GOES_ON and m:
            self.out.append(m.group())
            self.pos = end
            return
        if not _NUMBER_SO_FAR.fullmatch(self.text, self.pos):
            raise _NoMatch
        self.out.append(self.text[self.pos:])
        self.pos = len(self.text)
        raise _End


class _End(Exception):
    """The text ended inside the arguments."""


def _escape(text: str) -> str:
    """A JSON string's inside (escape_json_string_inner: nlohmann's dump, UTF-8 kept)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def read_calls(text: str, names: list[str], limit: int | None) -> list[tuple[str, str]]:
    """The calls at the start of `text` (which begins with `<|tool_call>`), as (name, arguments
    JSON) each: the repeat of `<|tool_call>call:NAME{...}<tool_call|>` in
    common_chat_params_init_gemma4, `limit` calls at most (None: any number). A call the text's
    end cuts short counts as far as it goes once its name is complete."""
    calls, pos = [], 0
    while limit is None or len(calls) < limit:
        if not text.startswith(CALL_HEAD, pos):
            break
        start = pos + len(CALL_HEAD)
        brace = text.find("{", start)
        if brace < 0 or text[start:brace] not in names:
            break  # a name still being written, or none of the tools
        try:
            args, end = _Arguments(text, brace).read()
        except _NoMatch:
            break
        if not CALL_END.startswith(text[end:end + len(CALL_END)]):
            break
        calls.append((text[start:brace], args))
        pos = end + len(CALL_END)
    return calls


class Gemma4Stream(ReplyText):
    """One choice's Gemma 4 reply turned into OpenAI chat deltas as its text arrives (the
    interface of tool_calls.ReplyStream: feed, finish, message, calls)."""

    def __init__(self, plan: ToolPlan | None, reasoning: bool, prompt_text: str = ""):
        self.plan = plan if plan is not None and plan.active else None
        self.names = [t["function"]["name"] for t in self.plan.callable_tools()] \
            if self.plan else []
        self.limit = None if self.plan and self.plan.parallel else 1
        self.reasoning = reasoning
        self.state = "message"  # message, thought, content, skip, calls, done
        self.skip_space = False
        self.pending = ""
        self.held = ""  # the calls' text, from the first <|tool_call>
        self.content = ""
        self.thought = ""
        self.calls: list[ToolCall] = []
        self.sent: list[str] = []  # the arguments streamed per call
        # llama.cpp parses the generation prompt with the reply: an opening `<|turn>model\n`
        # is read as the model's own when the prompt lacks it (after a tool's response), and
        # with thinking off the prompt's empty thought is part of the reply (content with
        # --reasoning-format none)
        self.turn = not prompt_text.endswith((TURN, NO_THINKING))
        self.owed: list[dict] = []
        if prompt_text.endswith(NO_THINKING):
            self.owed = self.feed(NO_THINKING)

    def feed(self, text: str) -> list[dict]:
        deltas, self.owed = self.owed, []
        self.pending += text
        while self.pending and self.state != "done":
            before = (self.pending, self.state)
            deltas += getattr(self, "_" + self.state)()
            if (self.pending, self.state) == before:
                break
        if self.state == "done":
            self.pending = ""
        return deltas

    # ------------------------------------------------------------------ the messages

    def _message(self) -> list[dict]:
        """A message's start: a thought (after any empty `<|channel>` markers) or content."""
        if self.turn:
            if TURN.startswith(self.pending):
                return []
            self.turn = False
            self.pending = self.pending.removeprefix(TURN)
            if not self.pending:
                return []
        text, i, opener = self.pending, 0, CHANNEL + THOUGHT
        while text.startswith(CHANNEL, i) and not opener.startswith(text[i:i + len(opener)]):
            i += len(CHANNEL)
        if text.startswith(opener, i):
            self.pending = text[i + len(opener):]
            self.state, self.skip_space = "thought", self.reasoning
            return [] if self.reasoning else self._out("content", opener)
        if opener.startswith(text[i:]):
            return []  # "<|chan", "<|channel>thou": wait
        if i:
            self._stop()  # <|channel> that opens no thought: the messages end
        else:
            self.state = "content"
        return []

    def _thought(self) -> list[dict]:
        text = self.pending
        if self.skip_space:
            text = self.pending = text.lstrip(SPACE)
            if not text:
                return []
            self.skip_space = False
        key = "reasoning_content" if self.reasoning else "content"
        i = text.find(CHANNEL_END)
        if i < 0:
            keep = _partial_suffix(text, CHANNEL_END)
            self.pending = text[len(text) - keep:]
            return self._out(key, text[:len(text) - keep])
        self.pending, self.state = text[i + len(CHANNEL_END):], "content"
        return self._out(key, text[:i] + ("" if self.reasoning else CHANNEL_END))

    def _content(self) -> list[dict]:
        text = self.pending
        stops = [CHANNEL, CHANNEL_END] + ([CALL] if self.plan else [])
        found = [(text.find(s), s) for s in stops if s in text]
        if not found:
            keep = max(_partial_suffix(text, s) for s in stops)
            self.pending = text[len(text) - keep:]
            return self._out("content", text[:len(text) - keep])
        i, stop = min(found)
        self.pending = text[i:]
        if stop == CHANNEL:
            self.state = "message"
        elif stop == CALL:
            self.state = "calls"
        else:
            self._stop()
        return self._out("content", text[:i])

    def _stop(self) -> None:
        """The messages end: with tools the reply goes on at its first call (the text up to
        it is dropped: scan-to-toolcall), without them it is over."""
        self.state = "skip" if self.plan else "done"

    def _skip(self) -> list[dict]:
        i = self.pending.find(CALL)
        if i < 0:
            self.pending = self.pending[len(self.pending) - _partial_suffix(self.pending, CALL):]
            return []
        self.pending, self.state = self.pending[i:], "calls"
        return []

    # ------------------------------------------------------------------ the calls

    def _calls(self) -> list[dict]:
        self.held += self.pending
        self.pending = ""
        return self._call_deltas(read_calls(self.held, self.names, self.limit))

    def _call_deltas(self, found: list[tuple[str, str]]) -> list[dict]:
        """A new call's first delta, and what its arguments' JSON grew by (the JSON read so
        far only grows while the call parses; what does not follow on is left to finish)."""
        deltas = []
        for i, (name, args) in enumerate(found):
            if i == len(self.calls):
                self.calls.append(ToolCall(name, ""))
                self.sent.append("")
                deltas.append({"tool_calls": [self.calls[i].openai(i)]})
            if args.startswith(self.sent[i]) and len(args) > len(self.sent[i]):
                deltas.append({"tool_calls": [{"index": i, "function": {
                    "arguments": args[len(self.sent[i]):]}}]})
                self.sent[i] = args
        return deltas

    def finish(self) -> list[dict]:
        """What is still owed at the end: a thought's unclosed text as reasoning (a marker cut
        short is dropped, as llama.cpp's lenient parse drops it), and the calls as parsed."""
        deltas, self.owed = self.owed, []
        if self.state == "thought" and not self.reasoning:
            deltas += self._out("content", self.pending)
        self.pending, self.state = "", "done"
        found = read_calls(self.held, self.names, self.limit) if self.held else []
        del self.calls[len(found):]  # announced, then failed to parse (llama.cpp drops them)
        deltas += self._call_deltas(found)
        for call, (_, args) in zip(self.calls, found):
            call.arguments = args
        return deltas

    def message(self) -> dict:
        """The whole reply as an OpenAI message (after finish), content and reasoning as
        captured (llama.cpp's Gemma 4 parser trims neither)."""
        msg = {"role": "assistant",
               "content": self.content if self.content or not self.calls else None}
        if self.thought:
            msg["reasoning_content"] = self.thought
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg


def grammar(tools: list[dict], parallel: bool, required: bool) -> str:
    """The calls' constraint in llguidance's Lark, after the grammar llama.cpp builds from its
    parser: a call names one of `tools` and its arguments are a Gemma 4 dict (keys and values
    are not held to the tool's schema, as llama.cpp's are not). The markers are special tokens
    of Gemma 4's vocabulary, named as such (<|tool_call>): no text can spell them. Lazy (tool
    choice auto): free text with thought channels, then the calls or nothing; required: an
    optional thought, then the calls."""
    names = " | ".join(json.dumps(t["function"]["name"]) for t in tools)
    calls = "(call+)" if parallel else "call"
    rules = (f'call: {CALL} "call:" ({names}) dict {CALL_END}\n'
             'dict: "{" WS? ("}" | pair ("," WS? pair)* WS? "}")\n'
             'pair: KEY ":" WS? value\n'
             'value: string | dict | array | NUMBER | "true" | "false" | "null"\n'
             'array: "[" WS? ("]" | value ("," WS? value)* WS? "]")\n'
             f"string: {QUOTE} TEXT? {QUOTE}\n"
             "KEY: /[^:}\\s][^:}]*/\n"
             f"NUMBER: /{_NUMBER.pattern}/\n"
             "WS: /[ \\t\\n]{1,20}/\n"
             "TEXT: /(?s:.+)/\n")
    if required:
        return f'start: thought? {calls}\nthought: {CHANNEL} "thought" TEXT? {CHANNEL_END}\n' + rules
    return f"start: free {calls}?\nfree: TEXT? (({CHANNEL} | {CHANNEL_END}) TEXT?)*\n" + rules
