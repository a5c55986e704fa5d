"""Response bodies as llama-server writes them (tools/server/server-task.cpp:
`to_json_oaicompat_chat`, `..._chat_stream`, `to_json_oaicompat`, `to_json_non_oaicompat`,
`usage_json_oaicompat`, `probs_vector_to_json`), which are the OpenAI API's shapes plus
llama.cpp's `timings`.

A `Choice` adds up one choice's generation events; `Shaper` writes the objects of one HTTP
request (one id, one creation time, the model's name).
"""
from __future__ import annotations

import json
import secrets
import time

# the scheduler's finish reasons → OpenAI's; "cancelled" never reaches a client, "error" is
# answered as an error object
FINISH_REASONS = {"stop": "stop", "eog": "stop", "length": "length", "context_full": "length"}
# → llama-server's stop_type for /completion
STOP_TYPES = {"stop": "word", "eog": "eos", "length": "limit", "context_full": "limit"}
FINGERPRINT = "llamatui"


def dumps(data) -> bytes:
    """Compact JSON as UTF-8, as every answer is written."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


class Choice:
    """One choice's generation: its text, token ids, log-probabilities and counts."""

    def __init__(self, index: int, tokenizer, n_top: int | None):
        self.index = index
        self.tokenizer = tokenizer
        self.n_top = n_top  # top log-probabilities to show; None: no log-probabilities
        self.parts: list[str] = []
        self.tokens: list[int] = []
        self.logprobs: list[dict] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.n_prompt = self.n_cached = self.n_generated = 0
        self.prompt_tps = self.gen_tps = 0.0
        self.slot = -1

    def add(self, event) -> dict | None:
        """Takes one event; returns the token's log-probability entry when it has one."""
        self.n_prompt, self.n_cached = event.n_prompt, event.n_reused
        self.n_generated, self.slot = event.n_generated, event.slot
        if event.prompt_tps:
            self.prompt_tps = event.prompt_tps
        if event.gen_tps:
            self.gen_tps = event.gen_tps
        if event.text:
            self.parts.append(event.text)
        entry = None
        if event.kind == "token":
            self.tokens.append(event.token_id)
            if self.n_top is not None and event.logprob is not None:
                entry = self._entry(event.token_id, event.logprob)
                entry["top_logprobs"] = [self._entry(t, lp)
                                         for t, lp in event.top_logprobs[:self.n_top]]
                self.logprobs.append(entry)
        elif event.kind == "done":
            self.finish_reason = event.finish_reason
            self.error = event.error
        return entry

    def _entry(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.token_to_piece(token)
        return {"id": token, "token": piece.decode("utf-8", "ignore"), "bytes": list(piece),
                "logprob": logprob}

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def oai_finish_reason(self) -> str:
        return FINISH_REASONS.get(self.finish_reason, "stop")

    def timings(self) -> dict:
        """llama-server's `timings` (result_timings::to_json)."""
        n_new = self.n_prompt - self.n_cached
        prompt_ms = 1000 * n_new / self.prompt_tps if self.prompt_tps else 0.0
        gen_ms = 1000 * self.n_generated / self.gen_tps if self.gen_tps else 0.0
        return {"cache_n": self.n_cached, "prompt_n": n_new, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / n_new if n_new else 0.0,
                "prompt_per_second": self.prompt_tps, "predicted_n": self.n_generated,
                "predicted_ms": gen_ms,
                "predicted_per_token_ms": gen_ms / self.n_generated if self.n_generated else 0.0,
                "predicted_per_second": self.gen_tps}


def usage(choices: list[Choice], n_per_prompt: int) -> dict:
    """OpenAI's usage: each prompt counted once (its first choice's), completions summed."""
    firsts = choices[::n_per_prompt]
    n_prompt = sum(c.n_prompt for c in firsts)
    n_gen = sum(c.n_generated for c in choices)
    return {"completion_tokens": n_gen, "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": sum(c.n_cached for c in firsts)}}


class Shaper:
    """The objects of one answer: chat.completion(.chunk), text_completion, /completion's."""

    def __init__(self, kind: str, model: str):
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{secrets.token_hex(16)}"
        self.created = int(time.time())
        self.model = model
        self.object = {"chat": "chat.completion", "completions": "text_completion"}.get(kind)
        self._content_tail: bytes | None = None

    def _envelope(self, choices: list, obj: str, **extra) -> dict:
        return {"choices": choices, "created": self.created, "id": self.id,
                "model": self.model, "system_fingerprint": FINGERPRINT, "object": obj, **extra}

    # chat

    def chat(self, choices: list[Choice], n: int, messages: list[dict]) -> dict:
        """messages: each choice's message (content, and tool_calls / reasoning_content when the
        reply had them: tool_calls.ReplyStream.message)."""
        out = []
        for c, message in zip(choices, messages):
            finish = "tool_calls" if message.get("tool_calls") else c.oai_finish_reason
            item = {"finish_reason": finish, "index": c.index, "message": message}
            if c.n_top is not None:
                item["logprobs"] = {"content": c.logprobs}
            out.append(item)
        return self._envelope(out, "chat.completion", usage=usage(choices, n),
                              timings=choices[0].timings())

    def chat_chunk(self, index: int, delta: dict, finish_reason: str | None = None,
                   logprobs: list | None = None, **extra) -> dict:
        item = {"finish_reason": finish_reason, "index": index, "delta": delta}
        if logprobs is not None:
            item["logprobs"] = {"content": logprobs}
        return self._envelope([item], "chat.completion.chunk", **extra)

    def content_chunk(self, index: int, text: str) -> bytes:
        """The SSE event of `chat_chunk(index, {"content": text})`, written around the text's
        JSON alone: the envelope's bytes are the same for every chunk of an answer, and a
        stream sends one such chunk per token."""
        if self._content_tail is None:
            envelope = dumps(self._envelope([], "chat.completion.chunk"))
            self._content_tail = b"}}]" + envelope[len(b'{"choices":[]'):] + b"\n\n"
        return (b'data: {"choices":[{"finish_reason":null,"index":%d,"delta":{"content":'
                % index + dumps(text) + self._content_tail)

    def usage_chunk(self, choices: list[Choice], n: int, obj: str) -> dict:
        return self._envelope([], obj, usage=usage(choices, n), timings=choices[0].timings())

    # completions

    def completion(self, choices: list[Choice], n: int) -> dict:
        out = [{"text": c.text, "index": c.index,
                "logprobs": completion_logprobs(c.logprobs) if c.n_top is not None else None,
                "finish_reason": c.oai_finish_reason} for c in choices]
        return self._envelope(out, "text_completion", usage=usage(choices, n),
                              timings=choices[0].timings())

    def completion_chunk(self, index: int, text: str, finish_reason: str | None = None,
                         logprobs: list | None = None, **extra) -> dict:
        item = {"text": text, "index": index,
                "logprobs": completion_logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason}
        return self._envelope([item], "text_completion", **extra)

    # llama-server's own /completion

    def native_partial(self, c: Choice, text: str, token: int | None,
                       entry: dict | None) -> dict:
        out = {"index": 0, "content": text, "tokens": [] if token is None else [token],
               "stop": False, "id_slot": c.slot, "tokens_predicted": c.n_generated,
               "tokens_evaluated": c.n_prompt}
        if entry is not None:
            out["completion_probabilities"] = [entry]
        return out

    def native_final(self, c: Choice, content: str, settings: dict) -> dict:
        out = {"index": 0, "content": content, "tokens": c.tokens if content else [],
               "id_slot": c.slot, "stop": True, "model": self.model,
               "tokens_predicted": c.n_generated, "tokens_evaluated": c.n_prompt,
               "generation_settings": settings, "has_new_line": "\n" in c.text,
               "truncated": False, "stop_type": STOP_TYPES.get(c.finish_reason, "none"),
               "stopping_word": "", "tokens_cached": c.n_prompt + c.n_generated,
               "timings": c.timings()}
        if c.n_top is not None and content:
            out["completion_probabilities"] = c.logprobs
        return out


def completion_logprobs(entries: list[dict]) -> dict:
    """/v1/completions' log-probabilities: OpenAI's legacy lists (tokens, token_logprobs,
    top_logprobs, text_offset), with llama-server's per-token `content` list beside them."""
    offsets, pos = [], 0
    for e in entries:
        offsets.append(pos)
        pos += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries],
            "text_offset": offsets, "content": entries}
