"""Chat templates: turn a conversation into the prompt text a model was trained on.

A GGUF model carries its Hugging Face chat template (Jinja) in `tokenizer.chat_template`. It is
rendered the way transformers does it — Jinja's `ImmutableSandboxedEnvironment` with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block, and the
helpers `raise_exception`, `strftime_now` and a `tojson` filter that does not escape non-ASCII or
HTML — and then adjusted the way llama.cpp's `common/chat.cpp` does it:

- a model without a template (or whose template is the word "chatml") gets ChatML,
  `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`;
- `bos_token` / `eos_token` are the texts of the vocabulary's BOS / EOS tokens;
- the variables are `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and
  `documents` (None), and llama.cpp's `enable_thinking` (True); `render(..., **extra)` adds or
  overrides any of them;
- when the tokenizer adds BOS itself (`tokenizer.ggml.add_bos_token`), a BOS text at the start of
  the rendered prompt is removed, and likewise a trailing EOS text when it adds EOS, so that
  tokenizing the prompt does not double them.

The sandbox keeps a template away from Python internals: reading an attribute such as
`__class__`, calling an unsafe function or mutating a list raises `ChatTemplateSecurityError`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "ChatTemplateError", "ChatTemplateSecurityError"]


class ChatTemplateError(ValueError):
    """The chat template cannot be compiled or rendered; for `raise_exception` in a template the
    message is the template's own."""


class ChatTemplateSecurityError(ChatTemplateError):
    """The template tried something the sandbox forbids (Python internals, mutation, ...)."""


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------
# the Jinja environment


class _Undefined(jinja2.Undefined):
    """Lenient like Jinja's default (templates test missing keys freely), except for the
    undefined the sandbox returns in place of an unsafe attribute: any use of that one raises."""

    __slots__ = ()

    def _unsafe(self) -> bool:
        return self._undefined_exception is SecurityError

    def __str__(self) -> str:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__str__()

    def __iter__(self):
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__iter__()

    def __bool__(self) -> bool:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__bool__()

    def __len__(self) -> int:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__len__()


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it);
    for rendering a prompt the body is simply output."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller):
        return caller()


def _raise_exception(message="") -> None:
    raise ChatTemplateError(str(message))


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise ChatTemplateError(f"strftime_now() needs a format string, got {type(fmt).__name__}")
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers replaces Jinja's tojson, which HTML-escapes and sorts keys
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=_Undefined,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


# --------------------------------------------------------------------------------------------
# messages


def _check_messages(messages) -> list[dict]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ValueError(
            "messages must be a list of {'role': str, 'content': str} dicts, "
            f"got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', "
                             f"got {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m:
                raise ValueError(f"messages[{i}] has no {key!r}")
        if not isinstance(m["role"], str) or not m["role"]:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty str, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]['content'] must be a str, "
                             f"got {type(m['content']).__name__}")
        out.append(dict(m))
    return out


# --------------------------------------------------------------------------------------------
# the template


# llama.cpp's add_bos default when a file has no tokenizer.ggml.add_bos_token: SentencePiece
# ("llama") and WordPiece ("bert") vocabularies add BOS, the others do not.
_ADD_BOS_DEFAULT = {"llama": True, "bert": True}
_ADD_EOS_DEFAULT = {"t5": True}


class ChatTemplate:
    """A compiled chat template. `render(messages)` gives the prompt text (special tokens as text:
    tokenize it with special-token parsing on)."""

    def __init__(self, source: str | None = None, *, bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, add_eos: bool = False):
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        self.is_chatml_fallback = not source or source.strip() == "chatml"
        self.source: str = CHATML_TEMPLATE if self.is_chatml_fallback else source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)
        try:
            self._template = _ENV.from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template does not compile: {e.message} (line {e.lineno})") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping, *, add_bos: bool | None = None,
                      add_eos: bool | None = None,
                      tokens: Sequence[str] | None = None) -> "ChatTemplate":
        """From a GGUF file's metadata: `tokenizer.chat_template` (else
        `tokenizer.chat_template.tool_use`, else ChatML), the BOS/EOS texts from
        `tokenizer.ggml.tokens` and `tokenizer.ggml.{bos,eos}_token_id`, and whether the tokenizer
        adds BOS/EOS (`tokenizer.ggml.add_{bos,eos}_token`; pass add_bos/add_eos to override).
        `tokens` (a Tokenizer's `vocab`, say) spares decoding the vocabulary list again."""
        source = metadata.get("tokenizer.chat_template")
        if not source:
            source = metadata.get("tokenizer.chat_template.tool_use")
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(
                f"tokenizer.chat_template must be a string, got {type(source).__name__}")

        if tokens is None:
            tokens = metadata.get("tokenizer.ggml.tokens")

        def token_text(key: str) -> str:
            tid = metadata.get(key)
            if tid is None or tokens is None:
                return ""
            tid = int(tid)
            if not 0 <= tid < len(tokens):
                raise ChatTemplateError(
                    f"{key} = {tid} is outside the vocabulary of {len(tokens)} tokens")
            return str(tokens[tid])

        model = metadata.get("tokenizer.ggml.model", "")
        if add_bos is None:
            add_bos = metadata.get("tokenizer.ggml.add_bos_token", _ADD_BOS_DEFAULT.get(model, False))
        if add_eos is None:
            add_eos = metadata.get("tokenizer.ggml.add_eos_token", _ADD_EOS_DEFAULT.get(model, False))
        return cls(source, bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"),
                   add_bos=bool(add_bos), add_eos=bool(add_eos))

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = True,
               **extra) -> str:
        """The prompt for `messages` (a list of {'role', 'content'} dicts; other keys pass
        through to the template). `extra` adds template variables (e.g. enable_thinking=False)."""
        msgs = _check_messages(messages)
        context = {
            "tools": None,
            "documents": None,
            "enable_thinking": True,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        context.update(extra)
        context["messages"] = msgs
        context["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            text = self._template.render(context)
        except ChatTemplateError:
            raise
        except SecurityError as e:
            raise ChatTemplateSecurityError(f"chat template blocked by the sandbox: {e}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                OverflowError, RecursionError) as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

        # llama.cpp: avoid a double BOS/EOS when the tokenizer adds them itself
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def __repr__(self) -> str:
        kind = "ChatML fallback" if self.is_chatml_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos={self.bos_token!r}, eos={self.eos_token!r})"
