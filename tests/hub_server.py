"""A small stand-in for the Hugging Face Hub, on 127.0.0.1, for tests (never huggingface.co).

It answers what huggingface_hub 2.x and our downloader ask, the way the Hub does:

    GET  /api/models?search=&filter=&sort=&limit=&author=     search (list of model dicts)
    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]     model_info, siblings with LFS sha256,
                                                              the `gguf` summary
    GET  /api/models/{repo}/tree/{rev}[/{path}]               list_repo_tree
    POST /api/models/{repo}/paths-info/{rev}                  get_paths_info (form or JSON)
    HEAD/GET /{repo}/resolve/{rev}/{path}                     LFS files: 302 to the "CDN" (a second
                                                              listener, another origin) with
                                                              X-Linked-Etag/-Size, X-Repo-Commit;
                                                              small files: 200 with their git oid
    GET  /cdn/{sha256}                                        bytes, Range / If-Range, ETag

Errors carry X-Error-Code like the Hub: RepoNotFound (404 missing, 401 private), GatedRepo (401
without a token, 403 with one), EntryNotFound, RevisionNotFound.

Test knobs on HubServer: `throttle` (bytes/s), `pause_at` {path: offset} (stop sending there until
`release` is set, the whole length announced), `close_at` {path: offset} (close the connection
there, every time), `close_every` {path: n} (close each response's connection after n bytes),
`corrupt` {paths} (one byte flipped), `ignore_range`, `etag_salt` (the CDN's ETag changes, as
when a file is replaced). Every request is logged in `requests` (header names lower-cased).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlparse

import numpy as np
import pytest

from llamatui.inference.catalog import GGML_TYPES
from llamatui.inference.gguf import GGUFValueType, GGUFWriter, ValueType


# ----------------------------------------------------------------------------- synthetic GGUFs

# A mix name → (type of the big matrices, of token_embd/output, general.file_type)
MIXES = {
    "F16": ("F16", "F16", 1), "Q8_0": ("Q8_0", "Q8_0", 7), "Q6_K": ("Q6_K", "Q6_K", 18),
    "Q5_K_M": ("Q5_K", "Q6_K", 17), "Q4_K_M": ("Q4_K", "Q6_K", 15), "Q4_K_S": ("Q4_K", "Q4_K", 14),
    "Q4_0": ("Q4_0", "Q6_K", 2), "Q3_K_M": ("Q3_K", "Q6_K", 12), "Q2_K": ("Q2_K", "Q6_K", 10),
    "IQ2_XS": ("IQ2_XS", "Q4_K", 20),
}


def make_gguf(mix: str = "Q4_K_M", *, arch: str = "llama", n_layer: int = 2, n_embd: int = 256,
              n_ff: int = 512, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
              context_length: int = 4096, sliding_window: int = 0, name: str = "Tiny",
              split: tuple[int, int] | None = None, seed: int = 0) -> bytes:
    """A small but well-formed GGUF model file (random weights) of the given quantization mix.
    `split=(i, n)`: shard i of n (the layers divided among shards, metadata in every one)."""
    rng = np.random.default_rng(seed)
    big, embd, ftype = MIXES[mix]
    head_dim = n_embd // n_head
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "m.gguf"
        w = GGUFWriter(path)
        p = arch + "."
        w.add("general.architecture", arch)
        w.add("general.name", name)
        w.add("general.file_type", ftype)
        w.add("general.quantization_version", 2)
        w.add(p + "context_length", context_length)
        w.add(p + "embedding_length", n_embd)
        w.add(p + "block_count", n_layer)
        w.add(p + "feed_forward_length", n_ff)
        w.add(p + "attention.head_count", n_head)
        w.add(p + "attention.head_count_kv", n_head_kv)
        w.add(p + "attention.layer_norm_rms_epsilon", 1e-6)
        w.add(p + "rope.freq_base", 10000.0)
        if arch == "gemma3":
            w.add(p + "attention.key_length", head_dim)
            w.add(p + "attention.value_length", head_dim)
            if sliding_window:
                w.add(p + "attention.sliding_window", sliding_window)
        else:
            w.add(p + "rope.dimension_count", head_dim)
        if split:
            w.add("split.no", split[0] - 1, GGUFValueType.UINT16)
            w.add("split.count", split[1], GGUFValueType.UINT16)
            w.add("split.tensors.count", 3 + 9 * n_layer, GGUFValueType.INT32)
        w.add("tokenizer.ggml.model", "gpt2")
        w.add("tokenizer.ggml.pre", "smollm")
        w.add("tokenizer.ggml.tokens", [f"<t{i}>" for i in range(n_vocab)],
              ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING)))
        w.add("tokenizer.ggml.token_type", np.ones(n_vocab, np.int32))
        w.add("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")

        def tensor(tname, type_name, shape):
            gt = GGML_TYPES[type_name]
            n = int(np.prod(shape))
            nbytes = n // gt.block_size * gt.type_size
            data = rng.integers(0, 256, nbytes, dtype=np.uint8)
            if type_name in ("F32", "F16"):  # finite values
                data = (rng.standard_normal(n).astype(np.float32 if type_name == "F32"
                                                      else np.float16)).view(np.uint8)
            w.add_tensor(tname, type_name, shape, data)

        layers = range(n_layer)
        first = split is None or split[0] == 1
        last = split is None or split[0] == split[1]
        if split:
            per = -(-n_layer // split[1])
            layers = range((split[0] - 1) * per, min(n_layer, split[0] * per))
        if first:
            tensor("token_embd.weight", embd, (n_vocab, n_embd))
        for il in layers:
            b = f"blk.{il}."
            tensor(b + "attn_norm.weight", "F32", (n_embd,))
            tensor(b + "attn_q.weight", big, (n_head * head_dim, n_embd))
            tensor(b + "attn_k.weight", big, (n_head_kv * head_dim, n_embd))
            tensor(b + "attn_v.weight", big, (n_head_kv * head_dim, n_embd))
            tensor(b + "attn_output.weight", big, (n_embd, n_head * head_dim))
            tensor(b + "ffn_norm.weight", "F32", (n_embd,))
            tensor(b + "ffn_gate.weight", big, (n_ff, n_embd))
            tensor(b + "ffn_up.weight", big, (n_ff, n_embd))
            tensor(b + "ffn_down.weight", big, (n_embd, n_ff))
        if last:
            tensor("output_norm.weight", "F32", (n_embd,))
            tensor("output.weight", embd, (n_vocab, n_embd))
        w.write()
        return path.read_bytes()


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ----------------------------------------------------------------------------- repositories


@dataclass
class RepoFileData:
    path: str
    data: bytes | None = None
    disk: pathlib.Path | None = None  # a large file served from disk
    size: int = 0
    sha256: str = ""
    oid: str = ""

    @property
    def lfs(self) -> bool:
        return not self.path.endswith((".md", ".json", ".txt", ".gitattributes"))

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.disk, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class FakeRepo:
    id: str
    files: dict[str, RepoFileData] = field(default_factory=dict)
    sha: str = ""
    gated: bool | str = False
    private: bool = False
    downloads: int = 0
    likes: int = 0
    tags: tuple[str, ...] = ("gguf",)
    gguf: dict | None = None
    created: str = "2025-01-01T00:00:00.000Z"
    pipeline_tag: str | None = "text-generation"
    trending: int = 0

    def add(self, path: str, data: bytes | None = None, disk: pathlib.Path | None = None
            ) -> RepoFileData:
        if disk is not None:
            h = hashlib.sha256()
            with open(disk, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            size = disk.stat().st_size
            f = RepoFileData(path, None, disk, size, h.hexdigest(), "")
            f.oid = hashlib.sha1(f"lfs-pointer {f.sha256}".encode()).hexdigest()
        else:
            f = RepoFileData(path, data, None, len(data), hashlib.sha256(data).hexdigest(),
                             git_blob_oid(data))
            if f.lfs:  # git stores the pointer file; its oid is not the content's
                f.oid = hashlib.sha1(f"lfs-pointer {f.sha256}".encode()).hexdigest()
        self.files[path] = f
        self.sha = hashlib.sha1(("".join(sorted(x.sha256 for x in self.files.values()))
                                 + self.id).encode()).hexdigest()
        return f

    def sibling(self, f: RepoFileData, blobs: bool) -> dict:
        d = {"rfilename": f.path}
        if blobs:
            d.update(size=f.size, blobId=f.oid)
            if f.lfs:
                d["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
        return d

    def tree_entry(self, f: RepoFileData) -> dict:
        d = {"type": "file", "oid": f.oid, "size": f.size, "path": f.path}
        if f.lfs:
            d["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        return d

    def search_dict(self, expand: list[str]) -> dict:
        """A search result: with `expand`, only `id` and the fields named (as the Hub does)."""
        d = self.model_dict(full=False)
        if self.gguf is not None:
            d["gguf"] = self.gguf
        return {k: v for k, v in d.items() if k in ("_id", "id", *expand)} if expand else d

    def model_dict(self, blobs: bool = False, full: bool = True) -> dict:
        d = {"_id": self.sha[:24], "id": self.id, "author": self.id.split("/")[0],
             "downloads": self.downloads, "likes": self.likes, "trendingScore": self.trending,
             "tags": list(self.tags), "pipeline_tag": self.pipeline_tag,
             "library_name": "gguf", "private": self.private, "gated": self.gated,
             "createdAt": self.created, "lastModified": self.created, "modelId": self.id}
        if full:
            d["sha"] = self.sha
            d["siblings"] = [self.sibling(f, blobs) for f in self.files.values()]
            d["disabled"] = False
            if self.gguf is not None:
                d["gguf"] = self.gguf
            d["usedStorage"] = sum(f.size for f in self.files.values())
        return d


# ----------------------------------------------------------------------------- the server


class HubServer:
    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[dict] = []
        self.throttle: float | None = None  # bytes per second for file bodies
        self.pause_at: dict[str, int] = {}
        self.close_at: dict[str, int] = {}
        self.close_every: dict[str, int] = {}
        self.paused = threading.Event()
        self.release = threading.Event()
        self.corrupt: set[str] = set()
        self.ignore_range = False
        self.etag_salt = ""
        self.token = "hf_test_token"  # the token tests put in HF_TOKEN
        self.not_found_code = "RepoNotFound"  # the Hub's X-Error-Code for a missing repo
        self.bytes_sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._servers = []
        self._connections: set = set()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "HubServer":
        for _ in range(2):  # the Hub, and a "CDN" on another origin
            srv = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                             daemon=True).start()
            self._servers.append(srv)
        self.url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def stop(self) -> None:
        """Stops listening and drops open connections (kept-alive ones too)."""
        self.release.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        with self._lock:
            conns, self._connections = list(self._connections), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def add_repo(self, repo_id: str, **kw) -> FakeRepo:
        repo = FakeRepo(repo_id, **kw)
        self.repos[repo_id] = repo
        return repo

    def log(self, **entry) -> dict:
        entry.setdefault("sent", 0)  # body bytes written for this request
        with self._lock:
            self.requests.append(entry)
        return entry

    def file_requests(self, path_part: str) -> list[dict]:
        return [r for r in self.requests if r["method"] in ("GET", "HEAD")
                and path_part in r["path"] and not r["path"].startswith("/api/")]

    def cdn_etag(self, f: RepoFileData) -> str:
        return f'"{f.sha256}{self.etag_salt}"'


class HubHandler(BaseHTTPRequestHandler):
    """The stand-in Hub's answers, one method per route (see the module docstring). `hub` is the
    HubServer whose repositories and knobs it serves: set on the subclass _make_handler makes
    for each server (`self.server` is the listener, as in any BaseHTTPRequestHandler)."""

    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        with self.hub._lock:
            self.hub._connections.add(self.connection)

    def finish(self):
        with self.hub._lock:
            self.hub._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # ------------------------------------------------------------ helpers

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str, message: str) -> None:
        self._json({"error": message}, status,
                   {"X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _repo(self, repo_id: str, for_files: bool = False) -> FakeRepo | None:
        """The repository, or None once the Hub's error for it is sent (missing, private, or
        gated when its files are asked for)."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, self.hub.not_found_code, "Repository not found")
            return None
        if repo.private:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and for_files:
            status = 403 if self._authorized() else 401
            self._error(status, "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to "
                        "it and be authenticated to access it. Please log in.")
            return None
        return repo

    # ------------------------------------------------------------ routing

    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def _route(self):
        u = urlparse(self.path)
        path = unquote(u.path)
        q = parse_qs(u.query)
        self.entry = self.hub.log(method=self.command, path=path, query=q,
                                  headers={k.lower(): v for k, v in self.headers.items()})
        try:
            if path == "/api/models":
                return self.search(q)
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/"):], q)
            if path.startswith("/cdn/"):
                return self.cdn(path[len("/cdn/"):])
            parts = path.strip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            self._error(404, "NotFound", f"no route for {path}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _api(self, rest: str, q):
        """/api/models/{owner}/{name}[/...]: the repository's own routes."""
        parts = rest.split("/")
        if len(parts) < 2:
            return self._error(404, "RepoNotFound", "Repository not found")
        repo = self._repo("/".join(parts[:2]))
        if repo is None:
            return
        tail = parts[2:]
        if not tail or tail[0] == "revision":
            return self.model_info(repo, tail[1] if len(tail) > 1 else None, q)
        if tail[0] == "tree" and len(tail) >= 2:
            return self.tree(repo, tail[1], "/".join(tail[2:]), q)
        if tail[0] == "paths-info" and self.command == "POST":
            return self.paths_info(repo)
        self._error(404, "NotFound", "unknown API route")

    # ------------------------------------------------------------ routes

    def search(self, q):
        """GET /api/models?search=&filter=&author=&sort=&limit=&expand="""
        repos = list(self.hub.repos.values())
        for tag in q.get("filter", []):
            repos = [r for r in repos if tag in r.tags]
        if "search" in q:
            s = q["search"][0].lower()
            repos = [r for r in repos if s in r.id.lower()]
        if "author" in q:
            repos = [r for r in repos if r.id.split("/")[0] == q["author"][0]]
        repos = [r for r in repos if not r.private]
        sort = q.get("sort", [None])[0]
        key = {"downloads": lambda r: r.downloads, "likes": lambda r: r.likes,
               "trendingScore": lambda r: r.trending,
               "createdAt": lambda r: r.created, "lastModified": lambda r: r.created}.get(sort)
        if key:
            repos.sort(key=key, reverse=True)
        limit = int(q.get("limit", [1000])[0])
        expand = q.get("expand", []) + q.get("expand[]", [])
        self._json([r.search_dict(expand) for r in repos[:limit]])

    def model_info(self, repo: FakeRepo, rev: str | None, q):
        """GET /api/models/{repo}[/revision/{rev}][?blobs=true]"""
        if rev is not None and rev not in ("main", repo.sha):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        blobs = q.get("blobs", ["false"])[0].lower() == "true"
        self._json(repo.model_dict(blobs=blobs))

    def tree(self, repo: FakeRepo, rev: str, prefix: str, q):
        """GET /api/models/{repo}/tree/{rev}[/{prefix}][?recursive=true]: the files under
        `prefix`; without `recursive`, a folder below it is one "directory" entry."""
        if rev not in ("main", repo.sha):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        recursive = q.get("recursive", ["false"])[0].lower() == "true"
        out, dirs = [], set()
        for f in repo.files.values():
            if prefix and not f.path.startswith(prefix + "/"):
                continue
            rel = f.path[len(prefix) + 1:] if prefix else f.path
            if "/" in rel and not recursive:
                d = (prefix + "/" if prefix else "") + rel.split("/")[0]
                if d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
                continue
            out.append(repo.tree_entry(f))
        self._json(out)

    def paths_info(self, repo: FakeRepo):
        """POST /api/models/{repo}/paths-info/{rev}: `paths` as a form or as JSON."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(body).get("paths", [])
        else:
            paths = parse_qs(body).get("paths", [])
        self._json([repo.tree_entry(repo.files[p]) for p in paths if p in repo.files])

    def resolve(self, repo_id: str, rev: str, fpath: str):
        """HEAD/GET /{repo}/resolve/{rev}/{path}: an LFS file redirects to the CDN, a small one
        is served here."""
        repo = self._repo(repo_id, for_files=True)
        if repo is None:
            return
        if rev not in ("main", repo.sha):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        f = repo.files.get(fpath)
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            location = f"{self.hub.cdn_url}/cdn/{quote(repo_id)}/{f.sha256}?file={quote(fpath)}"
            return self._send(302, b"", {**common, "Location": location,
                                         "ETag": f'"{f.oid}"', "X-Linked-Etag": f'"{f.sha256}"',
                                         "X-Linked-Size": str(f.size)})
        self._body(f, {**common, "ETag": f'"{f.oid}"'}, f'"{f.oid}"')

    def cdn(self, rest: str):
        """GET /cdn/{repo}/{sha256}: an LFS file's bytes, with the CDN's ETag."""
        repo_id, _, sha = rest.rpartition("/")
        repo = self.hub.repos.get(repo_id)
        f = next((x for x in (repo.files.values() if repo else ()) if x.sha256 == sha), None)
        if f is None:
            return self._send(404, b"NoSuchKey", ctype="text/plain")
        etag = self.hub.cdn_etag(f)
        self._body(f, {"ETag": etag, "Accept-Ranges": "bytes"}, etag)

    # ------------------------------------------------------------ file bodies

    def _body(self, f: RepoFileData, headers: dict, etag: str):
        """The file, or the part a Range asks for (when If-Range, if any, still matches)."""
        start, end, status = 0, f.size, 200
        rng = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if rng and not self.hub.ignore_range and (if_range is None or if_range == etag):
            spec = rng.strip().removeprefix("bytes=")
            a, _, b = spec.partition("-")
            start = int(a) if a else max(0, f.size - int(b))
            end = min(f.size, int(b) + 1) if (a and b) else f.size
            if start >= f.size:
                return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{f.size}"}
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self._stream(f, start, end)

    def _stream(self, f: RepoFileData, start: int, end: int):
        """Bytes [start, end) of the file, as the knobs say: throttled, paused, cut short,
        corrupted."""
        hub = self.hub
        pause = hub.pause_at.get(f.path)
        # Where this response's body stops short of its Content-Length, closing.
        cut = min(end, hub.close_at.get(f.path, end), start + hub.close_every.get(f.path, end))
        pos = start
        step = 64 << 10
        t0 = time.monotonic()
        while pos < end:
            if pause is not None and pos >= pause and not hub.release.is_set():
                self.wfile.flush()
                hub.paused.set()
                hub.release.wait(60)
                self.close_connection = True
                return  # the client was killed meanwhile; or it sees a short body
            if pos >= cut:
                self.wfile.flush()
                self.close_connection = True
                return
            n = min(step, cut - pos)  # cut <= end
            if pause is not None and pos < pause:
                n = min(n, pause - pos)
            chunk = f.read(pos, pos + n)
            if f.path in hub.corrupt and pos + n == f.size:  # the last byte flipped
                chunk = chunk[:-1] + bytes([chunk[-1] ^ 0xFF])
            self.wfile.write(chunk)
            pos += n
            with hub._lock:
                hub.bytes_sent[f.path] = hub.bytes_sent.get(f.path, 0) + n
                self.entry["sent"] += n
            if hub.throttle:
                ahead = (pos - start) / hub.throttle - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)


def _make_handler(server: HubServer) -> type[HubHandler]:
    """The handler class for one of `server`'s listeners."""
    return type("Handler", (HubHandler,), {"hub": server})


# ----------------------------------------------------------------------------- fixture


def point_at(server: HubServer, monkeypatch) -> None:
    """Makes this process (and its children, through the environment) use the stand-in Hub."""
    import huggingface_hub.constants as hfc
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setattr(hfc, "ENDPOINT", server.url)
    # no user-agent telemetry: it would fetch {ENDPOINT}/api/agent-harnesses
    monkeypatch.setattr(hfc, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_TOKEN", server.token)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def hub_server(monkeypatch):
    server = HubServer().start()
    point_at(server, monkeypatch)
    try:
        yield server
    finally:
        server.stop()


def child_env(server: HubServer, store: pathlib.Path) -> dict:
    """Environment for a subprocess that downloads from the stand-in Hub into `store`."""
    env = dict(os.environ)
    env.update(HF_ENDPOINT=server.url, HF_TOKEN=server.token, LLAMATUI_HOME=str(store.parent),
               NO_PROXY="127.0.0.1,localhost", PYTHONUNBUFFERED="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    return env


def populate(server: HubServer, big_vocab: int = 8192) -> dict[str, FakeRepo]:
    """The repositories most tests use:

    acme/Tiny-GGUF     IQ2_XS, Q2_K, Q4_K_M (a few MB), Q8_0, a Q6_K split in 2 shards in a
                       folder, an mmproj, an imatrix and a README; gguf summary
    acme/NoDefault-GGUF  Q8_0 and Q5_K_M only
    acme/Gated-GGUF    gated; acme/Private-GGUF private
    other/Popular-GGUF most downloads, few likes, a gguf summary naming an architecture the
                       engine does not run; acme/Torch-Model not tagged gguf
    """
    tiny = server.add_repo("acme/Tiny-GGUF", downloads=500, likes=40, trending=5,
                           created="2025-03-01T00:00:00.000Z",
                           gguf={"total": 1_443_072, "architecture": "llama",
                                 "context_length": 4096, "chat_template": "{{ x }}",
                                 "bos_token": "<s>", "eos_token": "</s>"})
    for q in ("IQ2_XS", "Q2_K", "Q8_0"):
        tiny.add(f"Tiny-{q}.gguf", make_gguf(q))
    tiny.add("Tiny-Q4_K_M.gguf", make_gguf("Q4_K_M", n_vocab=big_vocab))
    for i in (1, 2):
        tiny.add(f"Q6_K/Tiny-Q6_K-0000{i}-of-00002.gguf", make_gguf("Q6_K", split=(i, 2)))
    tiny.add("mmproj-Tiny-F16.gguf", make_gguf("F16", n_layer=1, name="projector"))
    tiny.add("Tiny.imatrix.dat", b"\x01" * 4096)
    tiny.add("README.md", b"# Tiny\n")
    nodef = server.add_repo("acme/NoDefault-GGUF", downloads=50, likes=400,
                            created="2025-02-01T00:00:00.000Z")
    nodef.add("NoDefault-Q8_0.gguf", make_gguf("Q8_0"))
    nodef.add("NoDefault-Q5_K_M.gguf", make_gguf("Q5_K_M"))
    gated = server.add_repo("acme/Gated-GGUF", gated="manual", downloads=5)
    gated.add("Gated-Q4_K_M.gguf", make_gguf("Q4_K_M"))
    private = server.add_repo("acme/Private-GGUF", private=True)
    private.add("Private-Q4_K_M.gguf", make_gguf("Q4_K_M"))
    server.add_repo("other/Popular-GGUF", downloads=90_000, likes=2,
                    gguf={"total": 1_000_000, "architecture": "mamba"}).add(
        "Popular-Q4_0.gguf", make_gguf("Q4_0"))
    server.add_repo("acme/Torch-Model", tags=("pytorch",), downloads=10**6).add(
        "model.safetensors", b"\0" * 64)
    return dict(server.repos)
