"""`llamatui hw`: this machine's RAM, CPU, SIMD, GPUs (free VRAM, what fits on each, whether GPU
offload works) and the store's free disk."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from .flags import add_ctx_size


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_ctx_size(p, 4096, model_default=False, what="the context the fits are planned for")


def run(args):
    from llamatui.models.hardware import detect

    from ..hardware_report import gpu_fits, machine_rows, what_it_runs
    hw = detect()
    runs = what_it_runs(hw, args.ctx_size) if hw.gpus else []
    if args.json:
        data = hw.as_dict()
        for g, d in zip(hw.gpus, data["gpus"]):
            d["fits"] = gpu_fits(g, runs)
        print(json.dumps(data, indent=1))
        return 0
    table = Table(title="Hardware", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for label, value in machine_rows(hw, runs):
        table.add_row(label, value)
    console = Console()
    console.print(table)
    for n in hw.notes:
        console.print(f"[dim]{n}[/]")
    return 0
