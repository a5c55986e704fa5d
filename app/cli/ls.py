"""`llamatui ls`: the models in the store, with what their headers say."""
from __future__ import annotations

import datetime
import json
import os

from rich.console import Console
from rich.table import Table

from llamatui.models.store import (disk_usage, list_incomplete, list_models, list_partials,
                                   store_dir)


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: int | None) -> str:
    if not n:
        return "?"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n < 10 * div else f"{n / div:.0f}{unit}"
    return str(n)


def when(ts: float | None) -> str:
    if not ts:
        return "never"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def run(args):
    store = store_dir()
    models = list_models(store)
    usage = disk_usage(store)
    partials = list_partials(store)
    incomplete = list_incomplete(store)
    if args.json:
        print(json.dumps({"store": str(store), "models": [m.as_dict() for m in models],
                          "partial_downloads": [
                              {"path": str(p.path), "repo": p.repo, "file": p.file,
                               "done": p.done, "total": p.total} for p in partials],
                          "incomplete": [
                              {"path": p.path, "target": p.target, "size": p.size,
                               "pid": p.pid, "abandoned": p.abandoned} for p in incomplete],
                          "disk": {"models_bytes": usage.models_bytes,
                                   "partial_bytes": usage.partial_bytes,
                                   "incomplete_bytes": usage.incomplete_bytes,
                                   "free_bytes": usage.free_bytes}}, indent=1))
        return 0
    console = Console()
    if not models:
        console.print(f"No models in {store}. Try `llamatui pull smollm2-135m` or "
                      "`llamatui search QUERY`.")
    else:
        table = Table(title=f"Models in {store}", title_justify="left")
        for col, kw in (("NAME", {}), ("ARCH", {}), ("PARAMS", {"justify": "right"}),
                        ("QUANT", {}), ("CONTEXT", {"justify": "right"}),
                        ("SIZE", {"justify": "right"}), ("SOURCE", {}), ("LAST USED", {})):
            table.add_column(col, **kw)
        for m in models:
            source = "hub" if m.source == "hf" else {"pypi": "starter"}.get(m.source, m.source)
            name = m.ref + (f" [dim](+{len(m.files) - 1} shards)[/]" if len(m.files) > 1 else "")
            if m.error:
                name += " [red](unreadable)[/]"
            table.add_row(name, m.architecture or "?", human_count(m.parameters),
                          m.quantization or "?", str(m.context_length or "?"),
                          human_bytes(m.size), source or "local", when(m.last_used))
        console.print(table)
    for p in partials:
        pct = f" {100 * p.done / p.total:.0f}%" if p.total else ""
        console.print(f"[yellow]partial download[/] {p.repo}/{p.file}: "
                      f"{human_bytes(p.done)}{pct} (pull it again to continue)")
    for p in incomplete:
        name = os.path.relpath(p.target or p.path, store)
        state = ("left by an interrupted run; the next pull or quantize removes it"
                 if p.abandoned else f"being written by process {p.pid}")
        console.print(f"[yellow]incomplete[/] {name}: {human_bytes(p.size)} ({state})")
    unfinished = usage.partial_bytes + usage.incomplete_bytes
    console.print(f"{len(models)} models, {human_bytes(usage.models_bytes)} used"
                  + (f" (+{human_bytes(unfinished)} unfinished)" if unfinished else "")
                  + f", {human_bytes(usage.free_bytes)} free")
    return 0
