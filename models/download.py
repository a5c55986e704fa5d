"""Downloads from the Hub into the store: progress, cancel, resume across runs, verification.

    path = pull("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", progress=show, cancel=event)

A file is fetched as `.<name>.partial` beside its final place, with `.<name>.partial.json`
recording where it comes from (URL pinned to the commit, ETag, size, sha256). A later run (any
process) sends `Range: bytes=N-` with `If-Range: <etag>` and appends; a server that answers 200
instead of 206 (the file changed, or no range support) restarts it cleanly. The whole file is
checked against the LFS sha256 before it is renamed to its final name, so the store never holds
a file that is not exactly the Hub's.

A dropped connection is reconnected (RETRIES times in a row without progress); a server that
goes silent mid-file ends the download after one READ_TIMEOUT with DownloadInterrupted, which
says how many bytes came (they are kept for the next pull).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace


from llamatui.inference.gguf import GGUFError, GGUFFile

from . import hub
from .hub import HubError, HubUnreachableError, RemoteFile, hub_call
from .store import (PARTIAL_SUFFIX, StoreError, _check_free_space, _write_sidecar, acquire_lock,
                    hub_target, read_sidecar, remove_leftovers, store_dir, writing_to)

CHUNK = 1 << 20  # local reads (hashing a partial file)
FREE_SPACE_MARGIN = 16 << 20
READ_TIMEOUT = 60.0  # seconds without a byte from the server: it has stalled
RETRIES = 3  # dropped connections in a row without progress: reconnect this many times
RETRY_PAUSE = 1.0  # seconds before the first reconnection, doubling up to 8


class DownloadCancelled(StoreError):
    """The download was cancelled; the partial file stays and a later pull continues it."""


class ChecksumError(StoreError):
    """The downloaded bytes are not the Hub's file; nothing was kept."""


class DownloadInterrupted(HubError):
    """The server sent less than it announced: it went silent, or kept closing the connection.
    The bytes received stay in the partial file and the next pull continues from them."""


class _ConnectionCut(Exception):
    """The body ended before its announced length (internal: reconnect and continue)."""


@dataclass
class DownloadProgress:
    """One progress report. `rate` in bytes/s over the last few seconds, `eta` in seconds (None
    while unknown). stage: "checking" (hashing a partial file before resuming), "downloading",
    "verifying", "done"."""
    repo: str
    file: str
    stage: str
    done: int
    total: int | None
    rate: float = 0.0
    eta: float | None = None
    resumed_from: int = 0
    file_index: int = 1  # for split models: which shard, of file_count
    file_count: int = 1
    overall_done: int | None = None  # all files of a pull together (set by `pull`)
    overall_total: int | None = None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


ProgressCallback = Callable[[DownloadProgress], None]


def stage_progress(report: Callable[[str, int, int], None]) -> ProgressCallback:
    """Adapts a (stage, done, total) callback, like app.progress.byte_progress's, to ours."""
    def cb(p: DownloadProgress) -> None:
        label = p.file.rsplit("/", 1)[-1]
        if p.file_count > 1:
            label += f" ({p.file_index}/{p.file_count})"
        if p.stage == "checking":
            label = f"Checking partial {label}"
        elif p.stage == "verifying":
            label = f"Verifying {label}"
        report(label, p.done, p.total or 0)
    return cb


class _Meter:
    """Rate over a sliding window, and throttled reports."""

    def __init__(self, callback, base: DownloadProgress, window: float = 5.0,
                 every: float = 0.1):
        self.cb, self.base, self.window, self.every = callback, base, window, every
        self.samples: deque = deque()
        self.last = 0.0

    def __call__(self, stage: str, done: int, force: bool = False) -> None:
        if self.cb is None:
            return
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        if not force and now - self.last < self.every:
            return
        self.last = now
        t0, d0 = self.samples[0]
        rate = (done - d0) / (now - t0) if now > t0 and done > d0 else 0.0
        total = self.base.total
        eta = (total - done) / rate if rate > 0 and total else None
        p = DownloadProgress(**{**self.base.__dict__, "stage": stage, "done": done,
                                "rate": rate, "eta": eta})
        self.cb(p)


def _partial_paths(target: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    partial = target.with_name(f".{target.name}{PARTIAL_SUFFIX}")
    return partial, partial.with_name(partial.name + ".json")


def _clear_non_file(path: pathlib.Path) -> None:
    """Removes whatever stands at one of our own partial-file names and is not a plain file (a
    directory, a link): left there, it would fail every retry with EISDIR, or send our bytes
    elsewhere."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _session_stream(url: str, headers: dict):
    from huggingface_hub.utils import get_session
    return get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                timeout=_httpx().Timeout(READ_TIMEOUT, connect=20.0))


def _httpx():
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover
        import httpx
    return httpx


def _is_sha256(s: str | None) -> bool:
    return bool(s) and re.fullmatch(r"[0-9a-f]{64}", s) is not None


def download_file(repo: str, filename: str, *, revision: str | None = None,
                  store: pathlib.Path | None = None, progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None, remote: RemoteFile | None = None,
                  file_index: int = 1, file_count: int = 1) -> pathlib.Path:
    """Fetches one file of a Hub repository into the store (`<store>/<owner>/<repo>/<file>`),
    continuing a partial download left by any earlier run. Returns the final path.

    `remote` (from a listing) gives the expected size and sha256; without it they come from
    the Hub (HEAD of the file, then paths-info). Raises DownloadCancelled (partial kept),
    ChecksumError (nothing kept), StoreError for disk space, HubError subclasses for the Hub."""
    store = pathlib.Path(store) if store else store_dir()
    target = hub_target(repo, filename, store)
    if target.is_file():
        side = read_sidecar(target)
        if side.get("repo") == repo and side.get("file") == filename and (
                remote is None or not remote.sha256 or side.get("sha256") == remote.sha256):
            return target
    elif target.exists() or target.is_symlink():
        raise StoreError(f"cannot download {repo}/{filename}: {target} exists and is not a "
                         "file; move it away")
    with writing_to(store, f"download {repo}/{filename}"):
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = acquire_lock(target, f"{repo}/{filename} is being downloaded by another process")
        try:
            if target.is_file() and read_sidecar(target).get("repo") == repo:
                return target
            return _download_locked(repo, filename, revision, target, progress, cancel, remote,
                                    file_index, file_count)
        finally:
            lock.release()


def _resolve(repo: str, filename: str, revision: str | None, remote: RemoteFile | None
             ) -> dict:
    """Commit, URL pinned to it, size, sha256 and ETag of a Hub file."""
    meta = hub.file_metadata(repo, filename, revision)
    commit = meta.commit_hash or revision or "main"
    size = remote.size if remote and remote.size is not None else meta.size
    sha = remote.sha256 if remote and remote.sha256 else None
    etag = meta.etag
    if not sha and _is_sha256(etag):
        sha = etag  # X-Linked-Etag of an LFS file is its sha256
    git_oid = None
    if not sha:
        info = hub.paths_info(repo, [filename], revision=commit).get(filename)
        if info is not None:
            sha = info.sha256
            size = size if size is not None else info.size
            git_oid = None if sha else info.blob_id
    if size is None:
        raise HubError(f"{repo}/{filename}: the Hub did not say how large the file is")
    return {"repo": repo, "file": filename, "revision": commit,
            "url": hub.resolve_url(repo, filename, commit), "size": int(size), "sha256": sha,
            "git_oid": git_oid, "etag": etag,
            "endpoint": hub.hub_endpoint()}


def _download_locked(repo, filename, revision, target, progress, cancel, remote, file_index,
                     file_count) -> pathlib.Path:
    partial, partial_meta = _partial_paths(target)
    _clear_non_file(partial)
    _clear_non_file(partial_meta)
    old = {}
    if partial.exists():
        try:
            old = json.loads(partial_meta.read_text())
        except (OSError, ValueError):
            old = {}
    meta = _resolve(repo, filename, revision, remote)
    size, sha = meta["size"], meta["sha256"]
    resumable = (partial.exists() and old.get("repo") == repo and old.get("file") == filename
                 and old.get("size") == size and old.get("sha256") == sha
                 and partial.stat().st_size <= size)
    if not resumable:
        partial.unlink(missing_ok=True)
        old = {}
    offset = partial.stat().st_size if resumable else 0
    _check_free_space(target.parent, size - offset + FREE_SPACE_MARGIN)
    # The server's own ETag from the last GET is what If-Range must carry; the Hub's linked
    # ETag is the fallback.
    meta["range_etag"] = old.get("range_etag") or meta.get("etag")
    meta["started_at"] = old.get("started_at") or time.time()
    _write_json(partial_meta, meta)
    base = DownloadProgress(repo, filename, "downloading", offset, size, resumed_from=offset,
                            file_index=file_index, file_count=file_count)
    meter = _Meter(progress, base)

    for attempt in (1, 2):
        digest = _fetch(meta, partial, partial_meta, offset, size, meter, cancel)
        expected = sha or meta.get("git_oid")
        if expected is None or digest == expected:
            break
        # A resumed download whose old bytes were wrong: try once more from scratch.
        if offset > 0 and attempt == 1:
            partial.unlink(missing_ok=True)
            offset = 0
            meta.pop("range_etag", None)
            _write_json(partial_meta, meta)
            continue
        partial.unlink(missing_ok=True)
        partial_meta.unlink(missing_ok=True)
        raise ChecksumError(f"{repo}/{filename}: downloaded data has sha256 {digest}, the Hub "
                            f"says {expected}; the download is corrupt and was discarded")
    meter("verifying", size, force=True)
    if target.name.endswith(".gguf"):
        try:
            GGUFFile.open(partial, join_splits=False).close()  # one shard at a time
        except GGUFError as e:
            partial.unlink(missing_ok=True)
            partial_meta.unlink(missing_ok=True)
            raise StoreError(f"{repo}/{filename} is not a valid GGUF file: {e}") from None
    os.replace(partial, target)
    _write_sidecar(target, {
        "source": "hf", "repo": repo, "file": filename, "revision": meta["revision"],
        "sha256": sha, "size": size, "url": meta["url"], "etag": meta.get("etag"),
        "endpoint": meta["endpoint"], "quant": hub.quant_of(filename),
        "pulled_at": time.time()})
    partial_meta.unlink(missing_ok=True)
    meter("done", size, force=True)
    return target


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _fetch(meta: dict, partial: pathlib.Path, partial_meta: pathlib.Path, offset: int,
           size: int, meter, cancel) -> str:
    """Appends the rest of the file to `partial` from `offset`; returns the hex digest of the
    whole file (sha256, or git's blob sha1 for a non-LFS file)."""
    git = meta.get("sha256") is None and meta.get("git_oid")
    repo, filename = meta["repo"], meta["file"]

    def new_hash():
        return hashlib.sha1(b"blob %d\0" % size) if git else hashlib.sha256()

    if offset:
        h = new_hash()
        with open(partial, "rb") as f:
            done = 0
            while done < offset:
                if cancel is not None and cancel.is_set():
                    raise DownloadCancelled(f"{repo}/{filename}: download cancelled")
                chunk = f.read(min(8 * CHUNK, offset - done))
                if not chunk:
                    break
                h.update(chunk)
                done += len(chunk)
                meter("checking", done)
    else:
        h = new_hash()
    done = offset
    failures = 0  # in a row, without progress
    while done < size:
        before = done
        try:
            done, h = _fetch_once(meta, partial, partial_meta, done, size, h, new_hash, meter,
                                  cancel)
        except (HubUnreachableError, _ConnectionCut) as e:
            done = partial.stat().st_size if partial.exists() else 0
            failures = 1 if done > before else failures + 1
            if failures > RETRIES:
                if isinstance(e, _ConnectionCut):
                    raise DownloadInterrupted(
                        f"{repo}/{filename}: the server closed the connection after {done} of "
                        f"{size} bytes, {failures} times in a row; pull again to continue from "
                        "there") from None
                raise
            pause = min(8.0, RETRY_PAUSE * 2.0 ** (failures - 1))
            if cancel is None:
                time.sleep(pause)
            elif cancel.wait(pause):
                raise DownloadCancelled(f"{repo}/{filename}: download cancelled") from None
            h = new_hash()
            if done:  # re-hash what is on disk (a cheap local read)
                with open(partial, "rb") as f:
                    while chunk := f.read(8 * CHUNK):
                        h.update(chunk)
    meter("downloading", done, force=True)
    return h.hexdigest()


def _fetch_once(meta: dict, partial: pathlib.Path, partial_meta: pathlib.Path, done: int,
                size: int, h, new_hash, meter, cancel) -> tuple[int, object]:
    """One GET of the file from byte `done` on, appended to `partial`; returns the new `done`
    and the digest so far. Raises _ConnectionCut when the body ends short (reconnect), and
    DownloadInterrupted when the server sends nothing for READ_TIMEOUT: waiting longer, or
    asking again, would make a stalled server look like a hang."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status
    httpx = _httpx()
    repo, filename = meta["repo"], meta["file"]
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"
    if done:
        headers["Range"] = f"bytes={done}-"
        if meta.get("range_etag"):
            headers["If-Range"] = meta["range_etag"]
    with hub_call(repo, filename):
        try:
            with _session_stream(meta["url"], headers) as r:
                if r.status_code >= 400:
                    if r.status_code == 416 and done == size:
                        return done, h
                    r.read()
                    hf_raise_for_status(r)
                if done and r.status_code == 200:
                    # If-Range failed (the file changed) or no range support: start over.
                    done = 0
                    h = new_hash()
                    mode = "wb"
                elif done and r.status_code == 206:
                    m = re.match(r"bytes (\d+)-", r.headers.get("Content-Range", ""))
                    if not m or int(m.group(1)) != done:
                        raise HubError(f"{repo}/{filename}: asked for bytes from {done}, the "
                                       f"server sent {r.headers.get('Content-Range')!r}")
                    mode = "ab"
                else:
                    mode = "wb"
                etag = r.headers.get("ETag")
                if etag and etag != meta.get("range_etag") and not etag.startswith("W/"):
                    meta["range_etag"] = etag
                    _write_json(partial_meta, meta)
                with open(partial, mode) as f:
                    try:
                        for chunk in r.iter_bytes():
                            if cancel is not None and cancel.is_set():
                                raise DownloadCancelled(
                                    f"{repo}/{filename}: download cancelled at {done} of {size} "
                                    "bytes; pull it again to continue")
                            if done + len(chunk) > size:
                                raise HubError(f"{repo}/{filename}: the server sent more than "
                                               f"the {size} bytes announced")
                            f.write(chunk)
                            f.flush()  # in the OS before the next read: kill -9 keeps it
                            h.update(chunk)
                            done += len(chunk)
                            meter("downloading", done)
                    except httpx.ReadTimeout:
                        raise DownloadInterrupted(
                            f"{repo}/{filename}: the server stopped sending after {done} of "
                            f"{size} bytes (nothing for {READ_TIMEOUT:g} s); pull again to "
                            "continue from there") from None
                    except httpx.TransportError as e:
                        raise _ConnectionCut(f"{type(e).__name__}: {e}") from None
                    finally:
                        f.flush()
                        os.fsync(f.fileno())
        except httpx.ReadTimeout:
            host = httpx.URL(meta["url"]).host
            raise DownloadInterrupted(
                f"{repo}/{filename}: the server at {host} accepted the connection but sent "
                f"nothing for {READ_TIMEOUT:g} s; pull again to retry") from None
    if done < size:
        raise _ConnectionCut(f"the body ended at {done} of {size} bytes")
    return done, h


# ----------------------------------------------------------------------------- pull


@dataclass
class PullResult:
    """What `pull` fetched: `path` (the model to load: its first shard), every file, and the
    listing it chose from (None when the model was already present and the Hub not asked)."""
    path: pathlib.Path
    files: list[pathlib.Path]
    quant: str | None
    listing: hub.RepoListing | None = None
    already_present: bool = False
    mmproj: list[pathlib.Path] = field(default_factory=list)


def pull(ref: str | hub.ModelRef, *, store: pathlib.Path | None = None,
         progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
         with_mmproj: bool = False) -> PullResult:
    """Downloads a model named like llama.cpp's -hf (`owner/repo`, `owner/repo:QUANT`, a file
    path in the repo, or a Hub URL): every shard of the chosen quantization. Offline, a model
    already in the store is returned as it is."""
    from .store import find_local
    ref = hub.parse_ref(ref) if isinstance(ref, str) else ref
    store = pathlib.Path(store) if store else store_dir()
    remove_leftovers(store)
    try:
        listing = hub.list_files(ref, store=store, offline_fallback=False)
    except HubUnreachableError:
        found = find_local(str(ref), store)
        if found is not None:
            return PullResult(found.path, found.files, found.quantization, None, True)
        raise
    group = listing.group_for(ref)
    if not group.complete:
        raise HubError(f"{ref.repo}: the split {group.quant} file lists "
                       f"{len(group.files)} of {group.first.shard[1]} shards")
    if group.size is not None:
        pending = sum(f.size or 0 for f in group.files
                      if not hub_target(ref.repo, f.path, store).is_file())
        if pending:
            _check_free_space(store, pending + FREE_SPACE_MARGIN)
    files = group.files + (listing.mmproj[:1] if with_mmproj else [])
    paths = []
    present = all(hub_target(ref.repo, f.path, store).is_file() for f in files)
    overall = sum(f.size or 0 for f in files) or None
    before = 0
    for i, f in enumerate(files, 1):
        def report(p, before=before):
            if progress is not None:
                progress(replace(p, overall_done=before + p.done, overall_total=overall))
        paths.append(download_file(ref.repo, f.path, revision=listing.revision, store=store,
                                   progress=report, cancel=cancel, remote=f, file_index=i,
                                   file_count=len(files)))
        before += f.size or 0
    n = len(group.files)
    return PullResult(paths[0], paths[:n], group.quant, listing, present, paths[n:])
