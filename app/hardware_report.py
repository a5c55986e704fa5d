"""What `llamatui hw` and the Hardware screen show: the machine's rows and what it can run.

`machine_rows(hw, runs)`: (label, value) rows for RAM, CPU, SIMD, each GPU with its free VRAM
and what fits on it alone (every layer, or how many with -ngl auto), whether GPU offload works
here (the engine's probe, with its reason when it does not), and the disk. `what_it_runs(hw,
n_ctx)`: the starter and stored models, each with its fit label. No Textual here: the CLI
imports it too.
"""
from __future__ import annotations

from llamatui.models import recommend as model_recommend
from llamatui.models import store as model_store

from .cli.ls import human_bytes


def gpu_fits(gpu, runs) -> str:
    """What fits on this GPU alone with -ngl auto: each model's offloaded layers."""
    parts = []
    for name, _, _, _, fit in runs:
        if isinstance(fit, str) or not gpu.vram_free:
            continue
        est = fit.estimate
        n = model_recommend.offload_plan(est, [gpu.vram_free]).n_gpu_layers
        total = est.shape.n_layer + 1  # llama.cpp's count: the output layer is one
        if not n:
            continue
        if est.approximate:  # a shape guessed from the file size: no layer counts
            parts.append(f"{name}: {'all layers' if n == total else 'some layers'}")
        else:
            parts.append(f"{name}: {f'all {total}' if n == total else f'{n} of {total}'} "
                         f"layers")
    return "; ".join(parts) or "no model's layers"


def machine_rows(hw, runs=()) -> list[tuple[str, str]]:
    """(label, value) rows describing a HardwareInfo; `runs` (what_it_runs) adds what fits on
    each GPU."""
    rows = [("System", f"{hw.os} ({hw.machine}), Python {hw.python}"),
            ("CPU", hw.cpu_model or "?"),
            ("Cores", f"{hw.physical_cores or '?'} physical, {hw.logical_cores or '?'} logical"),
            ("SIMD", " ".join(hw.simd) or "none detected"),
            ("RAM", f"{human_bytes(hw.ram_available)} available of "
                    f"{human_bytes(hw.ram_total)}")]
    if hw.gpus:
        for g in hw.gpus:
            vram = (f"{human_bytes(g.vram_free)} free of {human_bytes(g.vram_total)}"
                    if g.vram_total is not None and g.vram_free is not None else "VRAM unknown")
            cc = f", compute {g.compute_capability}" if g.compute_capability else ""
            rows.append((f"GPU {g.index}", f"{g.name}: {vram}{cc} (via {g.backend})"))
            if runs:
                rows.append(("  fits", gpu_fits(g, runs)))
    else:
        rows.append(("GPU", "none detected (models run on the CPU)"))
    offload = getattr(hw, "gpu_offload", None)
    if offload:
        rows.append(("GPU offload", offload))
    if hw.disk_free is not None:
        rows.append(("Disk", f"{human_bytes(hw.disk_free)} free of "
                             f"{human_bytes(hw.disk_total or 0)} at {hw.disk_path}"))
    else:
        rows.append(("Disk", "unknown"))
    return rows


def what_it_runs(hw, n_ctx: int) -> list[tuple[str, str, int, str, object]]:
    """(model, source, size, note, Fit or error text) for the starter models and the store's
    models, at context n_ctx."""
    out = []
    store = model_store.store_dir()
    starters = {s.filename: s for s in model_store.STARTER_MODELS.values()}
    local = [m for m in model_store.list_models() if m.kind == "model"] \
        if store.is_dir() else []
    local_names = {m.path.name for m in local}
    for s in model_store.STARTER_MODELS.values():
        if s.filename in local_names:
            continue  # listed with the store's models below
        try:
            est = model_recommend.estimate(
                model_recommend.ModelShape.from_hub_info(None, s.size), n_ctx)
            fit = model_recommend.assess(est, hw)
        except Exception as e:  # noqa: BLE001
            fit = str(e)
        out.append((s.title, "starter (not downloaded)", s.size, "estimate from size", fit))
    for m in local:
        source = "starter" if m.path.name in starters else (m.repo or m.source)
        if m.error:
            out.append((m.name, source, m.size, "", f"unreadable: {m.error}"))
            continue
        try:
            fit = model_recommend.assess(model_recommend.estimate_file(m.path, n_ctx), hw)
        except Exception as e:  # noqa: BLE001
            fit = f"{type(e).__name__}: {e}"
        out.append((m.name, source, m.size, "", fit))
    return out
