"""The models of the store, as the model chooser and the app's first start list them."""
from __future__ import annotations

import pathlib

from llamatui.models import store as model_store

from .formatting import fmt_bytes, fmt_count


def store_models(store: pathlib.Path | None = None) -> list[tuple[pathlib.Path, str]]:
    """The usable models in the store as (path, one-line description), by name. Uses the
    store's own listing (Hub downloads in subfolders, split models as one) where it has one."""
    store = store or model_store.store_dir()
    if not store.is_dir():
        return []
    list_models = getattr(model_store, "list_models", None)
    if list_models is None:
        return [(p, fmt_bytes(p.stat().st_size)) for p in sorted(store.glob("*.gguf"))
                if not p.name.startswith(".")]
    out = []
    for m in list_models(store):
        if m.kind != "model" or m.error:
            continue
        facts = [fmt_bytes(m.size)]
        if m.quantization:
            facts.append(m.quantization)
        if m.parameters:
            facts.append(f"{fmt_count(m.parameters)} parameters")
        out.append((m.path, " · ".join(facts)))
    return out


def mark_used(path: str) -> None:
    """Tells the store a model of its own was just loaded (for `llamatui ls`)."""
    mark = getattr(model_store, "mark_used", None)
    try:
        inside = pathlib.Path(path).resolve().is_relative_to(model_store.store_dir().resolve())
    except OSError:
        inside = False
    if mark is not None and inside:
        mark(path)
