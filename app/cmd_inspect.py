"""`llamatui inspect MODEL [--json]`: a GGUF file's metadata, tensors and totals, like gguf-dump."""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

from rich.console import Console
from rich.table import Table

from llamatui.models.store import resolve_model

ARRAY_HEAD = 8  # long arrays are summarized by their first elements


def add_arguments(p):
    p.add_argument("model", help="path to a .gguf file, or a model name in the store")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def describe(path) -> dict:
    """Everything `inspect` shows, as plain JSON-able data."""
    from llamatui.inference.gguf import GGUFFile  # numba: loaded only when a command needs it
    with GGUFFile.open(path) as f:
        metadata = {key: _summarize(f.metadata[key], f.metadata.types[key])
                    for key in f.metadata}
        tensors = [{"name": t.name, "type": t.type, "shape": list(t.shape),
                    "n_elements": t.n_elements, "bytes": t.nbytes, "offset": t.offset}
                   for t in f.tensors.values()]
        n_params = sum(t["n_elements"] for t in tensors)
        tensor_bytes = sum(t["bytes"] for t in tensors)
        return {
            "path": str(path),
            "version": f.version,
            "alignment": f.alignment,
            "metadata": metadata,
            "tensors": tensors,
            "totals": {
                "n_tensors": len(tensors),
                "parameters": n_params,
                "tensor_bytes": tensor_bytes,
                "file_bytes": os.path.getsize(path),
                "bits_per_weight": 8 * tensor_bytes / n_params if n_params else 0.0,
                "types": dict(Counter(t["type"] for t in tensors).most_common()),
            },
        }


def _summarize(value, vtype):
    import numpy as np
    from llamatui.inference.gguf import GGUFValueType
    if vtype.type != GGUFValueType.ARRAY:
        return value
    items = value.tolist() if isinstance(value, np.ndarray) else value
    if vtype.element.type == GGUFValueType.ARRAY:
        items = [v.tolist() if isinstance(v, np.ndarray) else v for v in items]
    if len(items) <= ARRAY_HEAD:
        return items
    return {"array_of": vtype.element.type.name, "length": len(items),
            "head": items[:ARRAY_HEAD]}


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
        print(json.dumps(info, indent=1, ensure_ascii=False))
        return 0
    # Piped output is for grep and friends: keep each row on one line.
    console = Console(width=None if sys.stdout.isatty() else 240)
    totals = info["totals"]
    console.print(f"[bold]{path}[/]  GGUF v{info['version']}, alignment {info['alignment']}, "
                  f"{len(info['metadata'])} metadata keys, {totals['n_tensors']} tensors")
    meta = Table("key", "value", title="Metadata", title_justify="left", show_edge=False)
    for key, value in info["metadata"].items():
        if isinstance(value, dict):
            shown = f"[{value['length']} × {value['array_of']}] {value['head']} …"
        else:
            shown = repr(value) if isinstance(value, str) else str(value)
        if key == "tokenizer.chat_template" and len(shown) > 120:
            shown = shown[:117] + "…"
        meta.add_row(key, shown)
    console.print(meta)
    tensors = Table("#", "name", "type", "shape", "bytes", title="Tensors", title_justify="left",
                    show_edge=False)
    for i, t in enumerate(info["tensors"]):
        tensors.add_row(str(i), t["name"], t["type"], " × ".join(map(str, t["shape"])),
                        f"{t['bytes']:,}")
    console.print(tensors)
    types = ", ".join(f"{k} {v}" for k, v in totals["types"].items())
    console.print(f"[bold]Totals:[/] {_human(totals['parameters'])} parameters, "
                  f"{totals['tensor_bytes'] / 2**20:.1f} MiB of tensors in a "
                  f"{totals['file_bytes'] / 2**20:.1f} MiB file, "
                  f"{totals['bits_per_weight']:.2f} bits per weight; tensor types: {types}")
    return 0
