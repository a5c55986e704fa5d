"""`llamatui inspect MODEL [--json]`: a GGUF file's metadata, tensors and totals, like gguf-dump."""
from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamatui.models.store import resolve_model

ARRAY_HEAD = 8  # long arrays are summarized by their first elements


def add_arguments(p):
    p.add_argument("model", help="path to a .gguf file, or a model name in the store")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def describe(path) -> dict:
    """Everything `inspect` shows, as plain JSON-able data. A split model's first shard
    describes the whole model (all shards' tensors; metadata from the first, as llama.cpp)."""
    from llamatui.inference import GGUFFile  # numba: loaded only when a command needs it
    with GGUFFile.open(path) as f:
        metadata = {key: _summarize(f.metadata[key], f.metadata.types[key])
                    for key in f.metadata}
        tensors = [{"name": t.name, "type": t.type, "shape": list(t.shape),
                    "n_elements": t.n_elements, "bytes": t.nbytes, "shard": t.shard,
                    "offset": t.offset}
                   for t in f.tensors.values()]
        n_params = sum(t["n_elements"] for t in tensors)
        tensor_bytes = sum(t["bytes"] for t in tensors)
        return {
            "path": str(path),
            "shards": [str(p) for p in f.shard_paths],
            "version": f.version,
            "alignment": f.alignment,
            "metadata": metadata,
            "tensors": tensors,
            "totals": {
                "n_tensors": len(tensors),
                "parameters": n_params,
                "tensor_bytes": tensor_bytes,
                "file_bytes": f.file_size,
                "bits_per_weight": 8 * tensor_bytes / n_params if n_params else 0.0,
                "types": dict(Counter(t["type"] for t in tensors).most_common()),
            },
        }


def _summarize(value, vtype):
    """A metadata value as JSON: arrays (nested to any depth) as lists, a long one as its first
    elements and length; numpy scalars as numbers; NaN and infinities, which JSON cannot hold,
    as the strings "NaN", "Infinity", "-Infinity"; undecodable string bytes as U+FFFD.
    `vtype` None: an inner array of an array of arrays whose inner arrays differ in type (the
    file declares no element type for those), summarized by what it holds."""
    from llamatui.inference import GGUFValueType
    if vtype is None:
        if not (isinstance(value, list) or getattr(value, "ndim", 0)):
            return _json_scalar(value)
    elif vtype.type != GGUFValueType.ARRAY:
        return _json_scalar(value)
    element = vtype.element if vtype is not None else None
    items = value.tolist() if hasattr(value, "tolist") else value
    head = [_summarize(v, element) for v in items[:ARRAY_HEAD]]
    if len(items) <= ARRAY_HEAD:
        return head
    return {"array_of": _element_name(element, value), "length": len(items), "head": head}


def _element_name(element, value) -> str:
    """The GGUF type name of an array's elements, from the declared type or else the value."""
    if element is not None:
        return element.type.name
    if hasattr(value, "dtype"):  # numpy's names, upper-cased, are GGUF's: INT32, FLOAT32, BOOL
        return value.dtype.name.upper()
    return "STRING" if all(isinstance(v, str) for v in value) else "ARRAY"


def _text(value) -> str:
    """A summarized value as the table shows it: strings quoted, a long array as
    [length × type] and its first elements, at any depth."""
    if isinstance(value, dict):
        return f"[{value['length']} × {value['array_of']}] {_text(value['head'])} …"
    if isinstance(value, list):
        return "[" + ", ".join(map(_text, value)) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _json_scalar(value):
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, str):  # the reader keeps invalid UTF-8 as surrogate escapes
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


def run(args):
    path = resolve_model(args.model)
    info = describe(path)
    if args.json:
        print(json.dumps(info, indent=1, ensure_ascii=False, allow_nan=False))
        return 0
    # Piped output is for grep and friends: keep each row on one line.
    console = Console(width=None if sys.stdout.isatty() else 240)
    totals = info["totals"]
    split = len(info["shards"]) > 1
    console.print(f"[bold]{escape(str(path))}[/]  GGUF v{info['version']}, "
                  f"alignment {info['alignment']}, "
                  f"{len(info['metadata'])} metadata keys, {totals['n_tensors']} tensors")
    if split:
        console.print(escape(f"split in {len(info['shards'])} shards: "
                             + ", ".join(os.path.basename(p) for p in info["shards"])))
    meta = Table("key", "value", title="Metadata", title_justify="left", show_edge=False)
    for key, value in info["metadata"].items():
        shown = _text(value)
        if key == "tokenizer.chat_template" and len(shown) > 120:
            shown = shown[:117] + "…"
        meta.add_row(escape(key), escape(shown))  # values are data, not Rich markup
    console.print(meta)
    tensors = Table("#", "name", "type", "shape", "bytes", *(["shard"] if split else []),
                    title="Tensors", title_justify="left", show_edge=False)
    for i, t in enumerate(info["tensors"]):
        tensors.add_row(str(i), escape(t["name"]), t["type"], " × ".join(map(str, t["shape"])),
                        f"{t['bytes']:,}", *([str(t["shard"] + 1)] if split else []))
    console.print(tensors)
    types = ", ".join(f"{k} {v}" for k, v in totals["types"].items())
    console.print(f"[bold]Totals:[/] {_human(totals['parameters'])} parameters, "
                  f"{totals['tensor_bytes'] / 2**20:.1f} MiB of tensors in "
                  f"{totals['file_bytes'] / 2**20:.1f} MiB of {'files' if split else 'file'}, "
                  f"{totals['bits_per_weight']:.2f} bits per weight; tensor types: {types}")
    return 0
