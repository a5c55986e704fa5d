"""One-click download-and-quantize: fetch a repository's F16/BF16 model, quantize it here.

    result = fetch_and_quantize("owner/Model-F16-GGUF", progress=report, cancel=event)
    result.path      # <store>/owner/Model-F16-GGUF/<stem>-Q4_K_M.gguf, ready to chat with
    result.reason    # why that type: "Q4_K_M: fits in RAM (0.3 GiB of 12.0 GiB usable)"

Steps: list the repository and pick its unquantized file (F16, then BF16, then F32; or the one the
reference names); choose the target type (the caller's, or the best of Q4_K_M and smaller mixes
that fits this machine, judged from the source's header by models.recommend); download it with
models.download (resumable); quantize it with quantizer.model.quantize_model beside the source
as `<stem>-<TYPE>.gguf` with a sidecar recording its origin; delete the source unless asked to
keep it.

Nothing half-written ever carries the final name: quantize_model writes a hidden partial file
and renames it when complete, and the sidecar is written after it; a partial file left by a
killed run is removed by the next pull or quantization into the store. Cancelling (or any
failure) leaves no output; a downloaded source stays so that a second try skips the download (a
partial download stays too, and is continued).

This lives in app/ because it needs both models (Hub, store, recommendation) and quantizer.
"""
from __future__ import annotations

import os
import pathlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


from llamatui.models import hub
from llamatui.models.download import DownloadCancelled, pull, stage_progress
from llamatui.models.recommend import Fit, ModelShape, assess, estimate
from llamatui.models.store import (StoreError, _write_sidecar, acquire_lock, free_bytes, hub_target,
                                   read_sidecar, sidecar_path, store_dir, writing_to)

__all__ = ["AUTO_CANDIDATES", "SOURCE_TYPES", "OneClickResult", "QuantizeCancelled",
           "choose_target", "fetch_and_quantize", "output_name"]

# The unquantized files worth quantizing from, preferred first.
SOURCE_TYPES = ("F16", "BF16", "F32")
# The automatic choice: Q4_K_M (llama.cpp's default) when it fits, else the next smaller mix.
# All are quantized without an importance matrix and run by the engine.
AUTO_CANDIDATES = ("Q4_K_M", "Q4_K_S", "IQ4_XS", "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
DISK_MARGIN = 16 << 20

Progress = Callable[[str, int, int], None]


class QuantizeCancelled(StoreError):
    """The quantization was cancelled; no output was left (the downloaded source stays)."""


@dataclass
class Choice:
    """The target type and why: its assessment against this machine (None when unknown)."""
    quant: str
    reason: str
    fit: Fit | None = None
    predicted_bytes: int | None = None
    candidates: list[Fit] = field(default_factory=list)


@dataclass
class OneClickResult:
    """What fetch_and_quantize made. Usable as a path (os.PathLike) to the quantized model."""
    path: pathlib.Path
    quant: str
    reason: str  # why this type was chosen
    repo: str
    source_file: str  # in the repository
    source_quant: str
    source_path: pathlib.Path | None  # None once deleted
    fit: Fit | None = None
    quantize: object | None = None  # quantizer.model.QuantizeResult; None if already present
    already_present: bool = False
    seconds: float = 0.0

    def __fspath__(self) -> str:
        return os.fspath(self.path)


# ----------------------------------------------------------------------------- pieces


def _source_group(listing: hub.RepoListing, ref: hub.ModelRef) -> hub.QuantGroup:
    """The unquantized file to start from: the one the reference names, else F16, BF16, F32."""
    if ref.filename or ref.quant:
        group = listing.group_for(ref)
        if hub.base_quant(group.quant) not in SOURCE_TYPES:
            raise StoreError(f"{ref.repo}: {group.first.path} is {group.quant}, already "
                             "quantized; quantizing again would compound the rounding errors. "
                             f"Name an F16/BF16 file, or pull {ref.repo}:{group.quant} as it is")
        return group
    for q in SOURCE_TYPES:
        g = listing.group(q)
        if g is not None:
            return g
    have = ", ".join(g.quant for g in listing.groups) or "none"
    raise StoreError(f"{ref.repo} offers no F16/BF16/F32 file to quantize from "
                     f"(quantizations: {have}); pull one of those as it is instead")


_TOKEN = re.compile(r"(?<![A-Za-z0-9])(BF16|FP16|FP32|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)


def output_name(source_name: str, quant: str) -> str:
    """`Model-F16.gguf` → `Model-Q4_K_M.gguf`; a name without a type gets `-Q4_K_M` added."""
    stem = source_name.removesuffix(".gguf")
    found = list(_TOKEN.finditer(stem))
    if found:
        m = found[-1]
        stem = stem[:m.start()] + quant + stem[m.end():]
    else:
        stem = f"{stem}-{quant}"
    return stem + ".gguf"


def _predicted(header, quant: str) -> tuple[int, frozenset[str]]:
    """(tensor bytes after quantizing, the matrices' types) by quantizer.model's own choice."""
    from llamatui.inference import GGML_TYPES
    from llamatui.quantizer.model import ModelFacts, plan_tensor_types, tensor_specs
    plans = plan_tensor_types(tensor_specs(header), ModelFacts.from_metadata(header.metadata),
                              quant)
    total = 0
    for p in plans:
        n = 1
        for d in p.shape:
            n *= int(d)
        g = GGML_TYPES[p.dst_type]
        total += n // g.block_size * g.type_size
    return total, frozenset(p.dst_type for p in plans if len(p.shape) >= 2)


def choose_target(header, file_bytes: int, hw=None, n_ctx: int = 4096,
                  target_type: str | None = None) -> Choice:
    """The quantization to make from an unquantized model whose header (a GGUFFile, possibly
    header-only) is given: `target_type` when set (assessed, not refused), else the first of
    AUTO_CANDIDATES whose memory estimate fits `hw` (models.hardware.detect() by default).
    Raises StoreError when none fits."""
    from llamatui.quantizer.model import parse_ftype
    if hw is None:
        from llamatui.models.hardware import detect
        hw = detect(gpus=True)
    src_tensor_bytes = sum(t.nbytes for t in header.tensors.values())
    shape = ModelShape.from_gguf(header, file_bytes=file_bytes)

    def fit_of(q: str) -> tuple[Fit, int]:
        tensors, types = _predicted(header, q)
        size = max(0, file_bytes - src_tensor_bytes) + tensors
        est = estimate(shape.with_file_bytes(size, types), n_ctx)
        return assess(est, hw, quant=q), size

    def describe(fit: Fit) -> str:
        usable = (getattr(hw, "ram_available", 0) or 0) * 0.9
        return (f"{fit.label}: needs {fit.estimate.total_bytes / 2**30:.2f} GiB at n_ctx "
                f"{n_ctx}, {usable / 2**30:.1f} GiB of RAM usable")

    if target_type:
        q = parse_ftype(target_type).name
        fit, size = fit_of(q)
        why = f"{q}: asked for ({describe(fit)})"
        if not fit.fits:
            why += "; warning: it may not run on this machine"
        return Choice(q, why, fit, size, [fit])
    tried = []
    for q in AUTO_CANDIDATES:
        fit, size = fit_of(q)
        tried.append(fit)
        if fit.fits and fit.supported is not False:
            lead = "the default, " if q == AUTO_CANDIDATES[0] else \
                "the largest that fits this machine, "
            return Choice(q, f"{q}: {lead}{describe(fit)}", fit, size, tried)
    last = tried[-1]
    raise StoreError(f"no quantization fits this machine: even {last.quant} "
                     f"{last.note or describe(last)}; try a smaller n_ctx or a smaller model")


def _report(progress: Progress | None) -> Progress:
    return progress or (lambda stage, done, total: None)


# ----------------------------------------------------------------------------- the whole


def fetch_and_quantize(ref: str | hub.ModelRef, target_type: str | None = None,
                       keep_source: bool = False, n_ctx: int = 4096,
                       progress: Progress | None = None,
                       cancel: threading.Event | None = None, *,
                       store: pathlib.Path | None = None, hw=None) -> OneClickResult:
    """Downloads the F16/BF16 model of `ref` (`owner/repo`, or `owner/repo:BF16` / a file path
    naming the source), quantizes it to `target_type` (default: the best type that fits this
    machine at `n_ctx`, Q4_K_M when it does) into the store beside the source, and deletes the
    source unless `keep_source`.

    progress(stage, done, total): the download (bytes, one stage label per file, as
    models.download.stage_progress gives), then "Quantizing to TYPE" (bytes written, after
    each tensor). Cancelling raises DownloadCancelled (partial download kept) or
    QuantizeCancelled (no output; the source kept)."""
    t0 = time.perf_counter()
    report = _report(progress)
    source = _Source.find(ref, pathlib.Path(store) if store else store_dir())
    earlier = source.made_earlier(target_type)
    if earlier is not None:
        earlier.seconds = time.perf_counter() - t0
        return earlier
    choice = source.choose_target(hw, n_ctx, target_type)
    quant, out = choice.quant, source.out_path(choice.quant)
    source.check_disk(choice)
    pulled = pull(hub.ModelRef(source.ref.repo, filename=source.file.path,
                               revision=source.ref.revision),
                  store=source.store, progress=stage_progress(report), cancel=cancel)
    with writing_to(source.store, f"quantize {source.file.name} to {quant}"):
        qr = _quantize_locked(pulled.path, out, quant, source.origin, choice, report, cancel)
        kept: pathlib.Path | None = pulled.path
        if not keep_source:
            _delete_download(pulled.files)
            kept = None
    return OneClickResult(out, quant, choice.reason, source.ref.repo, source.file.path,
                          source.group.quant, kept, choice.fit, qr, False,
                          time.perf_counter() - t0)


@dataclass
class _Source:
    """The unquantized file of a repository that fetch_and_quantize starts from, and where it
    and its quantizations go in the store."""
    ref: hub.ModelRef
    store: pathlib.Path
    listing: hub.RepoListing
    group: hub.QuantGroup
    target: pathlib.Path  # where the source is, or will be, in the store
    have_source: bool  # whether it was there already when the run began

    @classmethod
    def find(cls, ref: str | hub.ModelRef, store: pathlib.Path) -> _Source:
        ref = hub.parse_ref(ref) if isinstance(ref, str) else ref
        listing = hub.list_files(ref, store=store, offline_fallback=True)
        group = _source_group(listing, ref)
        if group.split:
            raise StoreError(f"{ref.repo}: {group.quant} is split in {len(group.files)} files; "
                             "quantizing split models is not supported yet")
        target = hub_target(ref.repo, group.first.path, store)
        return cls(ref, store, listing, group, target, target.is_file())

    @property
    def file(self) -> hub.RemoteFile:
        return self.group.first

    @property
    def origin(self) -> dict:
        """What the quantization's sidecar records of its source."""
        return {"repo": self.ref.repo, "file": self.file.path,
                "revision": self.listing.revision, "sha256": self.file.sha256,
                "type": self.group.quant}

    def out_path(self, quant: str) -> pathlib.Path:
        """The quantization's file, beside the source: never the name of a file of the
        repository, which a pull would then shadow."""
        name = output_name(self.file.name, quant)
        folder = self.file.path.rpartition("/")[0]
        if self.listing.file(f"{folder}/{name}" if folder else name) is not None:
            name = name.removesuffix(".gguf") + "-local.gguf"
        return self.target.with_name(name)

    def made_earlier(self, target_type: str | None) -> OneClickResult | None:
        """The quantization an earlier run made from this same source, if there is one."""
        from llamatui.quantizer.model import parse_ftype
        wanted = [parse_ftype(target_type).name] if target_type else list(AUTO_CANDIDATES)
        for quant in wanted:
            path = self.out_path(quant)
            side = read_sidecar(path) if path.is_file() else {}
            if side.get("quant") == quant and \
                    side.get("quantized_from", {}).get("sha256") == self.file.sha256:
                return OneClickResult(path, quant, side.get("reason") or f"{quant}: made earlier",
                                      self.ref.repo, self.file.path, self.group.quant,
                                      self.target if self.target.is_file() else None,
                                      already_present=True)
        return None

    def choose_target(self, hw, n_ctx: int, target_type: str | None) -> Choice:
        """choose_target from the source's header: the local file's, else fetched by a Range
        request."""
        from llamatui.inference import GGUFFile
        if self.have_source:
            with GGUFFile.open(self.target) as g:
                return choose_target(g, self.target.stat().st_size, hw, n_ctx, target_type)
        header = hub.fetch_header(self.ref.repo, self.file.path, self.listing.revision)
        return choose_target(header, self.file.size or 0, hw, n_ctx, target_type)

    def check_disk(self, choice: Choice) -> None:
        """StoreError unless the source (what is left to download of it) and the output fit on
        the disk at once."""
        pending = 0 if self.have_source else (self.file.size or 0)
        needed = pending + (choice.predicted_bytes or 0) + DISK_MARGIN
        free = free_bytes(self.target.parent)
        if free < needed:
            raise StoreError(f"not enough disk space in {self.store}: {needed / 1e6:.0f} MB "
                             f"needed for the {self.group.quant} download and the "
                             f"{choice.quant} file, {free / 1e6:.0f} MB free")


def _delete_download(files: list[pathlib.Path]) -> None:
    """Removes a pulled source: its files, their sidecars and their lock files."""
    for f in files:
        f.unlink(missing_ok=True)
        sidecar_path(f).unlink(missing_ok=True)
        f.with_name(f".{f.name}.lock").unlink(missing_ok=True)


def _quantize_locked(src_path: pathlib.Path, out: pathlib.Path, quant: str, origin: dict,
                     choice: Choice, report: Progress, cancel: threading.Event | None):
    """Quantizes `src_path` into `out` under `out`'s lock, then writes its sidecar; on any
    failure nothing is left under `out`'s name."""
    from llamatui.quantizer.model import quantize_model
    lock = acquire_lock(out, f"{out.name} is being made by another process")
    try:
        stage = f"Quantizing to {quant}"
        report(stage, 0, 0)

        def on_tensor(i, n, plan):
            if cancel is not None and cancel.is_set():
                raise QuantizeCancelled(f"quantizing {src_path.name} to {quant} was cancelled "
                                        f"at tensor {i} of {n}; nothing was written")

        qr = quantize_model(src_path, out, quant, progress=lambda d, t: report(stage, d, t),
                            on_tensor=on_tensor)
        _write_sidecar(out, {
            "source": "quantized", "repo": origin["repo"], "quant": quant,
            "quantized_from": origin, "quantized_at": time.time(),
            "reason": choice.reason, "size": qr.file_size})
    except BaseException:
        if not out.is_file():
            sidecar_path(out).unlink(missing_ok=True)
        raise
    finally:
        lock.release()
        out.with_name(f".{out.name}.lock").unlink(missing_ok=True)
    return qr


__all__ += ["Choice", "DownloadCancelled"]
