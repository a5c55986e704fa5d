"""`llamatui hw`: this machine's RAM, CPU, SIMD, GPUs and the store's free disk."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from .cmd_ls import human_bytes


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def run(args):
    from llamatui.models.hardware import detect
    hw = detect()
    if args.json:
        print(json.dumps(hw.as_dict(), indent=1))
        return 0
    table = Table(title="Hardware", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("System", f"{hw.os} ({hw.machine}), Python {hw.python}")
    table.add_row("CPU", hw.cpu_model or "?")
    table.add_row("Cores", f"{hw.physical_cores or '?'} physical, {hw.logical_cores or '?'} "
                  "logical")
    table.add_row("SIMD", " ".join(hw.simd) or "none detected")
    table.add_row("RAM", f"{human_bytes(hw.ram_available)} available of "
                  f"{human_bytes(hw.ram_total)}")
    if hw.gpus:
        for g in hw.gpus:
            cc = f", compute {g.compute_capability}" if g.compute_capability else ""
            table.add_row(f"GPU {g.index}", f"{g.name}: {human_bytes(g.vram_free)} free of "
                          f"{human_bytes(g.vram_total)}{cc} (via {g.backend})")
    else:
        table.add_row("GPU", "none detected")
    table.add_row("Disk", f"{human_bytes(hw.disk_free)} free of {human_bytes(hw.disk_total)} "
                  f"at {hw.disk_path}")
    console = Console()
    console.print(table)
    for n in hw.notes:
        console.print(f"[dim]{n}[/]")
    return 0
