"""What the app calls a model, and whether it chats: from the starter catalogue, the file's
name or its metadata."""
from __future__ import annotations

import pathlib
import re

from llamatui.models import store as model_store
from llamatui.models.hub import quant_of

_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")
_TITLE_QUANT = re.compile(r"\s*\([^()]*\)$")  # the catalogue's "(Q4_1)"

BASE_MODEL = "base model: it continues your text rather than chatting"


def starter_for(path) -> model_store.StarterModel | None:
    """The starter catalogue's entry of a model file, if it is one."""
    name = pathlib.Path(path).name
    return next((m for m in model_store.STARTER_MODELS.values() if m.filename == name), None)


def model_display_name(path, general_name: str | None = None) -> str:
    """What the app calls a model. GGUF's general.name is often the converter's guess from raw
    metadata ("Smollm2 135M 8k Lc100K Mix1 Ep2" for SmolLM2-135M-Instruct), so, in order: the
    starter catalogue's title, the file's name when its author capitalised it
    ("SmolLM2-135M-Instruct.Q4_1.gguf" → "SmolLM2 135M Instruct"), general.name, the file name.
    """
    path = pathlib.Path(path)
    starter = starter_for(path)
    if starter is not None:
        return _TITLE_QUANT.sub("", starter.title)
    stem = _SHARD_SUFFIX.sub("", path.name.removesuffix(".gguf"))
    quant = quant_of(stem)
    cut = stem.upper().rfind(quant) if quant else -1
    if cut > 0:  # the quantization and the separator before it
        stem = stem[:cut].rstrip("-_. ")
    words = re.sub(r"[-_ ]+", " ", stem).strip()
    if words and words != words.lower():
        return words
    return general_name or words or path.name


def base_model_hint(path, no_chat_template: bool) -> str | None:
    """A warning for a model that will not chat well, from the starter catalogue or from the
    model having no chat template (the engine then speaks ChatML to it, as llama.cpp does)."""
    starter = starter_for(path)
    if starter is not None and starter.base_model:
        return f"{model_display_name(path)} is a {BASE_MODEL}."
    if no_chat_template:
        return f"This model has no chat template, so it may be a {BASE_MODEL}."
    return None
