"""The Hugging Face Hub, seen as a catalogue of GGUF models.

    search_models("qwen", sort="downloads")        # repos tagged gguf, most downloaded first
    listing = list_files("bartowski/Llama-3.2-1B-Instruct-GGUF")
    listing.groups                                 # QuantGroup per quantization, shards together
    listing.select("Q4_K_M")                       # or listing.select() for llama.cpp's default
    header = fetch_header(repo, listing.select().first.path)   # GGUFFile, header only

Model references are written as llama.cpp's `-hf` takes them: `owner/repo`, `owner/repo:Q4_K_M`,
or a Hub URL (`https://huggingface.co/owner/repo`, `.../blob/main/file.gguf`, `hf.co/owner/repo`).

The Hub's address is read at call time from `HF_ENDPOINT` (huggingface_hub reads it once, at
import), so a process can point at a mirror, or a test at its stand-in Hub, after importing
huggingface_hub. When the Hub cannot be reached, `list_files` answers from what is already in the
local store (the sidecars record repo, file, revision and sha256).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlparse

from llamatui.inference.catalog import ARCHITECTURES, MIXES, MIXES_BY_NAME
from llamatui.inference.support import mix_runs_here

from .store import StoreError

# ----------------------------------------------------------------------------- errors


class HubError(StoreError):
    """A Hub request failed; the message says why and what to do."""


class RepoNotFoundError(HubError):
    """No such repository (or a private one the token cannot see)."""


class GatedRepoError(HubError):
    """The repository is gated: its license must be accepted on the Hub, and a token used."""


class EntryNotFoundError(HubError):
    """The repository exists but not the file (or quantization) asked for."""


class HubUnreachableError(HubError):
    """No connection to the Hub (offline, DNS, refused, timed out, HF_HUB_OFFLINE)."""


def hub_endpoint() -> str:
    """The Hub's base URL: $HF_ENDPOINT now, else what huggingface_hub read at import."""
    env = os.environ.get("HF_ENDPOINT", "").strip()
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants
    return constants.ENDPOINT.rstrip("/")


def hf_api():
    from huggingface_hub import HfApi
    return HfApi(endpoint=hub_endpoint())


def _offline_mode() -> bool:
    v = os.environ.get("HF_HUB_OFFLINE", "")
    return v.upper() in ("1", "ON", "YES", "TRUE")


def translate_error(exc: BaseException, repo: str, filename: str | None = None
                    ) -> HubError | None:
    """A huggingface_hub / httpx error as one of ours, with a message for people; None when
    `exc` is not a Hub or network error."""
    from huggingface_hub import errors as hfe
    what = f"{repo}/{filename}" if filename else repo
    url = f"{hub_endpoint()}/{repo}"
    if isinstance(exc, hfe.GatedRepoError):
        return GatedRepoError(
            f"{repo} is a gated repository: accept its license at {url} and log in "
            "(set HF_TOKEN, or run `hf auth login`) to download it")
    if isinstance(exc, hfe.RepositoryNotFoundError):
        return RepoNotFoundError(
            f"repository {repo} not found on {hub_endpoint()} (if it is private, log in with a "
            "token that can read it: set HF_TOKEN, or run `hf auth login`)")
    if isinstance(exc, hfe.RevisionNotFoundError):
        return EntryNotFoundError(f"{repo}: revision not found ({exc.response.url})")
    if isinstance(exc, hfe.EntryNotFoundError):
        return EntryNotFoundError(f"{what}: no such file in the repository")
    if isinstance(exc, hfe.OfflineModeIsEnabled):
        return HubUnreachableError(f"cannot reach the Hub for {what}: HF_HUB_OFFLINE is set")
    if isinstance(exc, hfe.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        code = exc.response.headers.get("X-Error-Code") if exc.response is not None else None
        if status == 404:  # an error code huggingface_hub does not know, or none
            if code in ("RepoNotFound", "RepositoryNotFound") or not filename:
                return RepoNotFoundError(f"repository {repo} not found on {hub_endpoint()}")
            return EntryNotFoundError(f"{what}: no such file in the repository")
        if status == 403:
            return GatedRepoError(f"{what}: access denied (403); your token lacks permission "
                                  f"for {url}")
        if status == 401:
            return RepoNotFoundError(f"{what}: authentication required (401); set HF_TOKEN")
        return HubError(f"the Hub answered {status} for {what}: "
                        f"{str(exc).strip().splitlines()[0]}")
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - older huggingface_hub
        import httpx
    if isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError)):
        return HubUnreachableError(f"cannot reach the Hub at {hub_endpoint()} for {what}: "
                                   f"{type(exc).__name__}: {exc}")
    return None


@contextlib.contextmanager
def hub_call(repo: str, filename: str | None = None):
    """Runs Hub requests, turning their failures into HubError subclasses."""
    try:
        yield
    except HubError:
        raise
    except Exception as e:  # noqa: BLE001 - translated or re-raised
        mapped = translate_error(e, repo, filename)
        if mapped is None:
            raise
        raise mapped from None


# ----------------------------------------------------------------------------- references

_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_HOSTS = ("huggingface.co", "hf.co", "www.huggingface.co")


@dataclass(frozen=True)
class ModelRef:
    """A model on the Hub: a repository, and optionally a quantization tag or a file in it."""
    repo: str
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None

    def __str__(self):
        if self.filename:
            return f"{self.repo}/{self.filename}"
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def parse_ref(text: str) -> ModelRef:
    """`owner/repo`, `owner/repo:QUANT`, `owner/repo/path/file.gguf`, or a Hub URL."""
    s = text.strip()
    if not s:
        raise ValueError("empty model reference")
    if "://" in s or s.startswith(("hf.co/", "huggingface.co/", "www.huggingface.co/")):
        return _parse_url(s if "://" in s else "https://" + s)
    if s.startswith("hf://"):
        s = s[5:]
    quant = None
    head, sep, tail = s.rpartition(":")
    if sep and "/" in head and "/" not in tail:
        s, quant = head, tail.strip() or None
    parts = s.strip("/").split("/")
    if len(parts) < 2:
        raise ValueError(f"{text!r} is not a Hub model reference (expected owner/repo, "
                         "owner/repo:QUANT or a huggingface.co URL)")
    repo = "/".join(parts[:2])
    if not _REPO_RE.match(repo):
        raise ValueError(f"{text!r}: {repo!r} is not a valid repository id")
    filename = "/".join(parts[2:]) or None
    return ModelRef(repo, quant=quant, filename=filename)


def _parse_url(url: str) -> ModelRef:
    u = urlparse(url)
    host = (u.hostname or "").lower()
    endpoint_host = (urlparse(hub_endpoint()).hostname or "").lower()
    if host not in _HUB_HOSTS and host != endpoint_host:
        raise ValueError(f"{url!r} is not a Hugging Face Hub address")
    parts = [unquote(p) for p in u.path.split("/") if p]
    if parts and parts[0] in ("models", "api"):
        parts = parts[1:] if parts[0] == "models" else parts[2:]
    if len(parts) < 2:
        raise ValueError(f"{url!r} does not name a repository")
    repo = "/".join(parts[:2])
    quant = None
    if ":" in repo.split("/")[1]:
        name, quant = repo.split("/")[1].split(":", 1)
        repo = f"{parts[0]}/{name}"
    rest = parts[2:]
    revision = filename = None
    if len(rest) >= 2 and rest[0] in ("blob", "resolve", "tree", "raw"):
        revision = rest[1]
        filename = "/".join(rest[2:]) or None
    if not _REPO_RE.match(repo):
        raise ValueError(f"{url!r}: {repo!r} is not a valid repository id")
    return ModelRef(repo, quant=quant, filename=filename, revision=revision)


def looks_like_hub_ref(text: str) -> bool:
    """Whether a CLI argument names a Hub model rather than a local file or a starter name."""
    if "://" in text or text.startswith(("hf.co/", "huggingface.co/")):
        return True
    if pathlib.Path(text).expanduser().exists():
        return False
    try:
        ref = parse_ref(text)
    except ValueError:
        return False
    if ref.filename is None:
        return not ref.repo.endswith(".gguf")  # dir/file.gguf is a path, not a repository
    return ref.filename.endswith(".gguf")


# ----------------------------------------------------------------------------- quantizations

QUALITY_ORDER = tuple(m.name for m in MIXES)  # llama.cpp's mixes, best first
_QUALITY_RANK = {q: i for i, q in enumerate(QUALITY_ORDER)}

_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:UD-)?("
    r"IQ[1-4]_(?:XXS|XS|NL|S|M)"
    r"|Q[2-8]_K(?:_(?:XXL|XL|S|M|L))?"
    r"|Q[4-8]_[01](?:_[0-9]_[0-9])?"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP16|FP32|F16|F32"
    r")(?![A-Za-z0-9])", re.IGNORECASE)
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def quant_of(path: str) -> str | None:
    """The quantization named in a file path (`...-Q4_K_M.gguf` → "Q4_K_M"), upper case; the
    file name wins over folder names. None when there is none."""
    name = path.rsplit("/", 1)[-1]
    for part in (name, path):
        found = _QUANT_RE.findall(part)
        if found:
            q = found[-1].upper()
            return {"FP16": "F16", "FP32": "F32"}.get(q, q)
    return None


def base_quant(quant: str | None) -> str | None:
    """A mix without the uploaders' embellishments: Q6_K_L → Q6_K, Q4_K_XL → Q4_K_M."""
    if quant is None:
        return None
    q = quant.upper()
    if q in _QUALITY_RANK:
        return q
    m = re.match(r"^(Q[2-8]_K)_(?:L|XL|XXL)$", q)
    if m:
        return m.group(1) if m.group(1) in ("Q6_K", "Q2_K") else m.group(1) + "_M"
    if q.startswith("MXFP4"):
        return "MXFP4"
    return None


def quality_rank(quant: str | None) -> float:
    """Lower is better. Embellished mixes (_L, _XL) sit just above their base."""
    if quant is None:
        return len(QUALITY_ORDER) + 1.0
    q = quant.upper()
    if q in _QUALITY_RANK:
        return float(_QUALITY_RANK[q])
    base = base_quant(q)
    if base in _QUALITY_RANK:
        return _QUALITY_RANK[base] - 0.5
    return len(QUALITY_ORDER) + 0.5


def engine_supports(quant: str | None) -> bool | None:
    """Whether the engine computes this mix; None when the name says nothing."""
    if quant is None:
        return None
    base = base_quant(quant)
    return mix_runs_here(MIXES_BY_NAME[base]) if base else False


def shard_of(path: str) -> tuple[int, int] | None:
    """(index, count), 1-based, of a `-0000i-of-0000N.gguf` split file."""
    m = _SHARD_RE.search(path)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _kind(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    if "mmproj" in name:
        return "mmproj"
    if "imatrix" in name:
        return "imatrix"
    if name.endswith(".gguf"):
        return "model"
    return "other"


# ----------------------------------------------------------------------------- listings


@dataclass(frozen=True)
class RemoteFile:
    path: str  # in the repository
    size: int | None = None
    sha256: str | None = None  # LFS oid
    blob_id: str | None = None  # git oid

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def quant(self) -> str | None:
        return quant_of(self.path)

    @property
    def shard(self) -> tuple[int, int] | None:
        return shard_of(self.path)


@dataclass
class QuantGroup:
    """One quantization of the model: a single file, or the shards of a split file in order."""
    quant: str
    files: list[RemoteFile]

    @property
    def first(self) -> RemoteFile:
        return self.files[0]

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(sizes)

    @property
    def split(self) -> bool:
        return len(self.files) > 1 or self.files[0].shard is not None

    @property
    def complete(self) -> bool:
        """For a split file: every shard is listed."""
        sh = self.files[0].shard
        if sh is None:
            return True
        return [f.shard for f in self.files] == [(i, sh[1]) for i in range(1, sh[1] + 1)]

    @property
    def supported(self) -> bool | None:
        return engine_supports(self.quant)

    @property
    def quality(self) -> float:
        return quality_rank(self.quant)


@dataclass(frozen=True)
class GGUFSummary:
    """The Hub's `gguf` field of a repository: what it read from the GGUF header."""
    parameters: int | None
    architecture: str | None
    context_length: int | None
    chat_template: bool
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_api(cls, data) -> "GGUFSummary | None":
        if not isinstance(data, dict) or not data:
            return None

        def _int(v):
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
        return cls(parameters=_int(data.get("total")), architecture=data.get("architecture"),
                   context_length=_int(data.get("context_length")),
                   chat_template=bool(data.get("chat_template")), raw=dict(data))


@dataclass
class RepoListing:
    """A repository's GGUF files, grouped: `groups` (per quantization, smallest first),
    `mmproj` and `imatrix` files set apart, `other` files ignored by the rest."""
    repo: str
    revision: str | None  # commit sha
    groups: list[QuantGroup]
    mmproj: list[RemoteFile] = field(default_factory=list)
    imatrix: list[RemoteFile] = field(default_factory=list)
    other: list[RemoteFile] = field(default_factory=list)
    gguf: GGUFSummary | None = None
    gated: bool | str = False
    private: bool = False
    downloads: int | None = None
    likes: int | None = None
    offline: bool = False  # built from the local store, the Hub being unreachable

    def group(self, quant: str) -> QuantGroup | None:
        q = quant.upper()
        for g in self.groups:
            if g.quant.upper() == q:
                return g
        return None

    def default_group(self) -> QuantGroup:
        """llama.cpp's choice for `-hf owner/repo`: Q4_K_M if present, else the first file."""
        if not self.groups:
            raise EntryNotFoundError(f"{self.repo} has no GGUF model files")
        return self.group("Q4_K_M") or self.groups[0]

    def select(self, quant: str | None = None) -> QuantGroup:
        """The group for a tag as `owner/repo:TAG` names it: an exact quantization, else the
        one group whose file names contain the tag (case-insensitive); None: default."""
        if not quant:
            return self.default_group()
        exact = self.group(quant)
        if exact:
            return exact
        t = quant.lower()
        loose = [g for g in self.groups if any(t in f.path.lower() for f in g.files)]
        if len(loose) == 1:
            return loose[0]
        have = ", ".join(g.quant for g in self.groups) or "none"
        if loose:
            raise EntryNotFoundError(f"{self.repo}: tag {quant!r} matches several files "
                                     f"({', '.join(g.quant for g in loose)})")
        raise EntryNotFoundError(f"{self.repo} has no {quant} file; quantizations: {have}")

    def group_for(self, ref: "ModelRef") -> QuantGroup:
        """The group a reference names: the one holding its file, else its tag's (see select)."""
        if not ref.filename:
            return self.select(ref.quant)
        f = self.file(ref.filename)
        if f is None:
            raise EntryNotFoundError(f"{ref.repo} has no file {ref.filename}")
        return next((g for g in self.groups if f in g.files), None) or \
            QuantGroup(f.quant or f.name, [f])

    def file(self, path: str) -> RemoteFile | None:
        for f in self.all_files():
            if f.path == path:
                return f
        return None

    def all_files(self) -> list[RemoteFile]:
        return [f for g in self.groups for f in g.files] + self.mmproj + self.imatrix + \
            self.other


def group_files(files: list[RemoteFile]) -> tuple[list[QuantGroup], list, list, list]:
    """(groups, mmproj, imatrix, other) from a repository's files. A group is one model: a
    single file, or the shards of one split file (those sharing its `-0000i-of-0000N.gguf`
    prefix, as llama.cpp finds them), in shard order."""
    models: dict[tuple[str, int], list[RemoteFile]] = {}  # (path or shard prefix, shard count)
    mmproj, imatrix, other = [], [], []
    for f in sorted(files, key=lambda f: f.path):
        kind = _kind(f.path)
        if kind == "mmproj":
            mmproj.append(f)
        elif kind == "imatrix":
            imatrix.append(f)
        elif kind == "other":
            other.append(f)
        else:
            sh = f.shard
            models.setdefault((_SHARD_RE.sub("", f.path), sh[1]) if sh else (f.path, 0),
                              []).append(f)
    groups: dict[str, list[RemoteFile]] = {}
    for (stem, _), fs in models.items():
        fs.sort(key=lambda f: (f.shard or (0, 0))[0])
        name = stem.rsplit("/", 1)[-1]
        key = fs[0].quant or (name if fs[0].shard else name.removesuffix(".gguf"))
        # Two different models with the same quantization (rare): keep them apart.
        if key in groups:
            key = f"{key} ({fs[0].name})"
        groups[key] = fs
    out = [QuantGroup(key, fs) for key, fs in groups.items()]
    out.sort(key=lambda g: (g.size if g.size is not None else 1 << 62, g.quant))
    return out, mmproj, imatrix, other


# ----------------------------------------------------------------------------- API calls


@dataclass(frozen=True)
class HubModel:
    """A search result."""
    id: str
    author: str | None
    downloads: int | None
    likes: int | None
    last_modified: str | None
    tags: tuple[str, ...]
    pipeline_tag: str | None
    gated: bool | str | None
    private: bool | None
    architecture: str | None = None  # from the Hub's gguf summary

    @classmethod
    def from_info(cls, m) -> "HubModel":
        lm = getattr(m, "last_modified", None)
        gguf = getattr(m, "gguf", None)
        arch = gguf.get("architecture") if isinstance(gguf, dict) else None
        return cls(id=m.id, author=getattr(m, "author", None) or m.id.split("/")[0],
                   downloads=getattr(m, "downloads", None), likes=getattr(m, "likes", None),
                   last_modified=lm.isoformat() if lm else None,
                   tags=tuple(getattr(m, "tags", None) or ()),
                   pipeline_tag=getattr(m, "pipeline_tag", None),
                   gated=getattr(m, "gated", None), private=getattr(m, "private", None),
                   architecture=arch if isinstance(arch, str) else None)

    @property
    def engine_runs(self) -> bool | None:
        """Whether this engine runs the repository's architecture (the catalog's answer);
        None when the Hub did not say which it is."""
        return None if self.architecture is None else self.architecture in ARCHITECTURES


SORTS = ("downloads", "likes", "trending_score", "last_modified", "created_at")
# what a search asks the Hub for (its `expand`): the usual fields plus the gguf summary, whose
# architecture says whether the engine runs the repository
SEARCH_FIELDS = ("author", "downloads", "likes", "lastModified", "tags", "pipeline_tag", "gated",
                 "private", "gguf")


def search_models(query: str | None = None, *, sort: str = "downloads", limit: int = 30,
                  author: str | None = None) -> list[HubModel]:
    """Repositories tagged `gguf` matching `query` (in their id), best first by `sort`."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    # The parameters of HfApi.list_models, in one request: its paginator retries a dead
    # connection for ~25 s, too long for a search box; one page is what is shown anyway.
    from huggingface_hub.hf_api import ModelInfo
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
    params: dict = {"filter": ["gguf"], "limit": max(1, min(int(limit), 1000)),
                    "expand": list(SEARCH_FIELDS)}
    if query:
        params["search"] = query
    if author:
        params["author"] = author
    params["sort"] = {"trending_score": "trendingScore", "last_modified": "lastModified",
                      "created_at": "createdAt"}.get(sort, sort)
    with hub_call(f"search {query!r}" if query else "search"):
        if _offline_mode():
            raise HubUnreachableError("cannot search the Hub: HF_HUB_OFFLINE is set")
        r = get_session().get(f"{hub_endpoint()}/api/models", params=params,
                              headers=build_hf_headers(), timeout=30)
        hf_raise_for_status(r)
        items = r.json()
    out = []
    for item in items[:limit]:
        item.setdefault("siblings", None)
        out.append(HubModel.from_info(ModelInfo(**item)))
    return out


def list_files(repo_or_ref: str | ModelRef, revision: str | None = None, *,
               store: pathlib.Path | None = None, offline_fallback: bool = True
               ) -> RepoListing:
    """A repository's files with sizes and LFS sha256, grouped by quantization. When the Hub is
    unreachable (and `offline_fallback`), the listing is built from the local store's sidecars
    (`offline` is then True) and raises HubUnreachableError only if nothing is there."""
    ref = parse_ref(repo_or_ref) if isinstance(repo_or_ref, str) else repo_or_ref
    revision = revision or ref.revision
    try:
        if _offline_mode():
            raise HubUnreachableError(f"HF_HUB_OFFLINE is set; cannot list {ref.repo}")
        with hub_call(ref.repo):
            info = hf_api().model_info(ref.repo, revision=revision, files_metadata=True)
    except HubUnreachableError:
        if offline_fallback:
            local = local_listing(ref.repo, store)
            if local is not None:
                return local
        raise
    files = []
    for s in info.siblings or []:
        lfs = s.lfs
        size = s.size if s.size is not None else (lfs.size if lfs else None)
        files.append(RemoteFile(s.rfilename, size, lfs.sha256 if lfs else None, s.blob_id))
    groups, mmproj, imatrix, other = group_files(files)
    return RepoListing(ref.repo, info.sha, groups, mmproj, imatrix, other,
                       gguf=GGUFSummary.from_api(getattr(info, "gguf", None)),
                       gated=info.gated or False, private=bool(info.private),
                       downloads=info.downloads, likes=info.likes)


def local_listing(repo: str, store: pathlib.Path | None = None) -> RepoListing | None:
    """What the local store holds of `repo`, as a listing (offline); None if nothing."""
    from .store import hub_sidecars
    entries = [s for s in hub_sidecars(store) if s.get("repo") == repo]
    if not entries:
        return None
    files = [RemoteFile(s["file"], s.get("size"), s.get("sha256")) for s in entries]
    groups, mmproj, imatrix, other = group_files(files)
    revisions = {s.get("revision") for s in entries}
    return RepoListing(repo, revisions.pop() if len(revisions) == 1 else None, groups, mmproj,
                       imatrix, other, offline=True)


def file_metadata(repo: str, filename: str, revision: str | None = None):
    """HEAD of the file's resolve URL: huggingface_hub's HfFileMetadata (commit_hash, etag —
    the LFS sha256 for LFS files —, size, location)."""
    from huggingface_hub import get_hf_file_metadata
    url = resolve_url(repo, filename, revision)
    with hub_call(repo, filename):
        return get_hf_file_metadata(url, endpoint=hub_endpoint())


def paths_info(repo: str, paths: list[str], revision: str | None = None) -> dict[str, RemoteFile]:
    """Sizes and LFS sha256 of a few files (the Hub's paths-info endpoint)."""
    with hub_call(repo, paths[0] if len(paths) == 1 else None):
        infos = hf_api().get_paths_info(repo, paths, revision=revision)
    out = {}
    for i in infos:
        if hasattr(i, "size"):
            out[i.path] = RemoteFile(i.path, i.size, i.lfs.sha256 if i.lfs else None, i.blob_id)
    return out


def resolve_url(repo: str, filename: str, revision: str | None = None) -> str:
    """`{endpoint}/{repo}/resolve/{revision}/{file}`. Built here rather than by hf_hub_url,
    whose template is fixed at import: it would keep huggingface.co after HF_ENDPOINT changes."""
    return (f"{hub_endpoint()}/{repo}/resolve/{quote(revision or 'main', safe='')}/"
            f"{quote(filename)}")


def fetch_range(url: str, start: int, end: int, repo: str = "", filename: str | None = None
                ) -> tuple[bytes, int | None]:
    """Bytes [start, end) of a Hub file (fewer at its end), and the file's total size when the
    server says (Content-Range)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
    headers = build_hf_headers()
    headers.update({"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"})
    with hub_call(repo or url, filename):
        r = get_session().get(url, headers=headers, follow_redirects=True, timeout=60)
        hf_raise_for_status(r)
    total = None
    cr = r.headers.get("Content-Range", "")
    m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", cr)
    if r.status_code == 206 and m:
        if int(m.group(1)) != start:
            raise HubError(f"{url}: asked for bytes from {start}, got {cr}")
        total = int(m.group(3)) if m.group(3) != "*" else None
        return r.content, total
    # 200: the server ignored Range and sent everything
    data = r.content
    return data[start:end], len(data)


HEADER_FIRST_BYTES = 2 << 20
# GGUFError messages that mean "the bytes ended inside the header"
_SHORT_HINTS = ("truncated", "past the end", "runs past", "cannot fit")
HEADER_MAX_BYTES = 128 << 20


def fetch_header(repo: str, filename: str, revision: str | None = None, *,
                 first_bytes: int = HEADER_FIRST_BYTES, max_bytes: int = HEADER_MAX_BYTES):
    """A remote GGUF file's header, parsed from its first bytes (HTTP Range requests, growing
    until the header fits): a GGUFFile whose tensors are described but hold no data."""
    from llamatui.inference.gguf import GGUFError, GGUFFile
    url = resolve_url(repo, filename, revision)
    data, total = fetch_range(url, 0, first_bytes, repo, filename)
    while True:
        try:
            return GGUFFile.from_bytes(data, name=f"{repo}/{filename}", header_only=True)
        except GGUFError as e:
            msg = str(e)
            short = total is None or len(data) < total
            if not short or not any(k in msg for k in _SHORT_HINTS):
                raise HubError(f"{repo}/{filename} is not a readable GGUF file: {msg}") from None
            if len(data) >= max_bytes:
                raise HubError(f"{repo}/{filename}: the GGUF header is larger than "
                               f"{max_bytes >> 20} MiB") from None
            want = min(max_bytes, len(data) * 2)
            more, total2 = fetch_range(url, len(data), want, repo, filename)
            if not more:
                raise HubError(f"{repo}/{filename}: the file ended inside its header") from None
            total = total2 or total
            data += more
