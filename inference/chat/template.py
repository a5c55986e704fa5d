"""Chat templates: turn a conversation into the prompt text a model was trained on.

A GGUF model carries its Hugging Face chat template (Jinja) in `tokenizer.chat_template`. It is
rendered the way transformers does it (see chat.sandbox: Jinja's sandbox, run in a worker
process that is stopped after TIME_LIMIT_S or MEMORY_LIMIT_BYTES) and then adjusted the way
llama.cpp's `common/chat.cpp` does it:

- `bos_token` / `eos_token` are the texts of the vocabulary's BOS / EOS tokens;
- the variables are `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and
  `documents` (None), and llama.cpp's `enable_thinking` (True); `render(..., **extra)` adds or
  overrides any of them (JSON values: they travel to the worker as JSON);
- when the tokenizer adds BOS itself (`tokenizer.ggml.add_bos_token`), a BOS text at the start of
  the rendered prompt is removed, and likewise a trailing EOS text when it adds EOS, so that
  tokenizing the prompt does not double them.

A template may also be one of llama.cpp's built-in ones by name (chat.builtin_templates:
"chatml", "gemma", "llama3", ...), rendered exactly as llama.cpp's `llm_chat_apply_template`
renders it (no Jinja, no BOS/EOS adjustment: llama.cpp's legacy path does none). A model without
a template gets one (`template_for_vocabulary`): "gemma" for a Gemma vocabulary, else "chatml".

A Jinja template compiles on its first render, so a broken one does not stop a model from
loading: every render raises ChatTemplateError (a ValueError) instead. The sandbox keeps a
template away from Python internals: reading an attribute such as `__class__`, calling an unsafe
function or mutating a list raises `ChatTemplateSecurityError`; running too long or using too much
memory raises `ChatTemplateLimitError`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import sandbox as template_sandbox
from .builtin_templates import BUILTIN_TEMPLATES, CHAT_TEMPLATE_NAMES
from ..hparams import Meta

__all__ = ["CHAT_TEMPLATE_NAMES", "ChatTemplate", "ChatTemplateError", "ChatTemplateLimitError",
           "ChatTemplateSecurityError", "template_for_vocabulary"]


class ChatTemplateError(ValueError):
    """The chat template cannot be compiled or rendered; for `raise_exception` in a template the
    message is the template's own."""


class ChatTemplateSecurityError(ChatTemplateError):
    """The template tried something the sandbox forbids (Python internals, mutation, ...)."""


class ChatTemplateLimitError(ChatTemplateError):
    """The template ran longer, used more memory or wrote a longer prompt than a render may."""


_ERRORS_BY_KIND = {"security": ChatTemplateSecurityError, "time": ChatTemplateLimitError,
                   "memory": ChatTemplateLimitError, "size": ChatTemplateLimitError}


def template_for_vocabulary(tokens) -> str:
    """The built-in template for a model that has none of its own.

    llama.cpp renders ChatML for every such model (common_chat_templates_init), except for one
    case it recognises from the vocabulary (llama_model_chat_template: Mistral-Small-2503's tekken
    vocabulary gets "mistral-v7-tekken"). A Gemma model spoken to in ChatML answers in Gemma's
    turns and never ends its reply, so here a vocabulary with Gemma's turn marker
    `<start_of_turn>` gets "gemma" (the marker llm_chat_detect_template looks for in a template's
    text), as llama.cpp itself picks "gemma" for a template that contains it."""
    return "gemma" if tokens is not None and "<start_of_turn>" in tokens else "chatml"


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
            # gpt-oss's template takes a tool-calling message without content (llama.cpp's
            # common_chat_params_init_gpt_oss removes it when the message has reasoning)
            if key not in m and not (key == "content" and m.get("tool_calls")):
                raise ValueError(f"messages[{i}] has no {key!r}")
        if not isinstance(m["role"], str) or not m["role"]:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty str, got {m['role']!r}")
        if "content" in m and not isinstance(m["content"], str):
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
    """A chat template: a built-in one by name, or Jinja source (compiled on first render).
    `render(messages)` gives the prompt text (special tokens as text: tokenize it with
    special-token parsing on).

    origin says where it came from: "model" (the GGUF's own), "vocabulary" (the model has none:
    chosen by template_for_vocabulary) or "override" (the caller's choice)."""

    def __init__(self, source: str | None = None, *, bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, add_eos: bool = False, origin: str = "override"):
        """source: a name from CHAT_TEMPLATE_NAMES or Jinja source; None or "" mean "chatml"."""
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        name = (source or "chatml").strip()
        self.builtin = BUILTIN_TEMPLATES.get(name)
        self.source: str = name if self.builtin else source
        self.origin = origin
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)

    @property
    def name(self) -> str | None:
        """The built-in template's name; None for Jinja source."""
        return self.builtin.name if self.builtin else None

    @property
    def end_of_turn(self) -> str | None:
        """The text that ends a reply under a built-in template (None for Jinja: the model's
        own template ends turns with tokens the vocabulary marks as end of generation)."""
        return self.builtin.end_of_turn if self.builtin else None

    @classmethod
    def from_metadata(cls, metadata: Mapping, source: str | None = None, *,
                      add_bos: bool | None = None, add_eos: bool | None = None,
                      tokens: Sequence[str] | None = None, tokenizer=None) -> "ChatTemplate":
        """For a GGUF file's model: `source` (a built-in name or Jinja source) when given, else
        `tokenizer.chat_template` (else `tokenizer.chat_template.tool_use`), else the built-in
        template_for_vocabulary picks.

        The BOS/EOS texts and whether the tokenizer adds them come from `tokenizer` (the model's
        Tokenizer: its special ids, llama.cpp's defaults included, as common/chat.cpp takes
        them from the vocabulary) when given; else from `tokenizer.ggml.tokens`,
        `tokenizer.ggml.{bos,eos}_token_id` and `tokenizer.ggml.add_{bos,eos}_token` (pass
        add_bos/add_eos to override, `tokens` to spare decoding the vocabulary again). A value
        of the wrong type raises ModelMetadataError naming the key."""
        meta = Meta(metadata, "")
        origin = "override"
        if not source:
            origin = "model"
            source = meta.str("tokenizer.chat_template", "") or \
                meta.str("tokenizer.chat_template.tool_use", "")
        if tokenizer is not None:
            tokens = tokenizer.vocab
        elif tokens is None:
            tokens = meta.strings("tokenizer.ggml.tokens", None)
        if not source:
            origin, source = "vocabulary", template_for_vocabulary(tokens)
        if tokenizer is not None:
            texts = [tokenizer.token_text(tid) if tid is not None else ""
                     for tid in (tokenizer.bos_id, tokenizer.eos_id)]
            return cls(source, bos_token=texts[0], eos_token=texts[1], add_bos=tokenizer.add_bos,
                       add_eos=tokenizer.add_eos, origin=origin)

        def token_text(key: str) -> str:
            tid = meta.int(key, None, lo=-2**63, hi=2**64 - 1)
            if tid is None or tokens is None:
                return ""
            if not 0 <= tid < len(tokens):
                raise ChatTemplateError(
                    f"{key} = {tid} is outside the vocabulary of {len(tokens)} tokens")
            return str(tokens[tid])

        model = meta.str("tokenizer.ggml.model", "")
        if add_bos is None:
            add_bos = meta.bool("tokenizer.ggml.add_bos_token", _ADD_BOS_DEFAULT.get(model, False))
        if add_eos is None:
            add_eos = meta.bool("tokenizer.ggml.add_eos_token", _ADD_EOS_DEFAULT.get(model, False))
        return cls(source, bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"),
                   add_bos=bool(add_bos), add_eos=bool(add_eos), origin=origin)

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = True,
               **extra) -> str:
        """The prompt for `messages` (a list of {'role', 'content'} dicts; other keys pass
        through to a Jinja template). `extra` adds template variables (e.g.
        enable_thinking=False); built-in templates take none."""
        msgs = _check_messages(messages)
        if self.builtin:
            return self.builtin.render(msgs, bool(add_generation_prompt))
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
            text = template_sandbox.render(self.source, context)
        except template_sandbox.TemplateFailure as e:
            raise _ERRORS_BY_KIND.get(e.kind, ChatTemplateError)(str(e)) from None

        # llama.cpp: avoid a double BOS/EOS when the tokenizer adds them itself
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def __repr__(self) -> str:
        kind = self.name or f"Jinja, {len(self.source)} chars"
        return f"ChatTemplate({kind}, {self.origin}, bos={self.bos_token!r}, " \
               f"eos={self.eos_token!r})"
