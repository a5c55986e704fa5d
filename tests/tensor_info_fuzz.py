"""Structure-aware fuzzing of GGUF tensor infos (and of nested metadata arrays, which `inspect`
prints): a tiny file of tensors of several types and ranks, written byte by byte so that the
tensor-info table can say anything, is given zero, huge or overflowing dimensions, too many or
no dimensions, offsets past the end of the data, overlapping or misaligned, unknown or
unsupported types, rows that are not a whole number of blocks, duplicate names, a truncated data
section, another alignment, a wrong tensor count, or nested metadata arrays of mixed depth.
Each case runs through every reader of tensors a user can reach:

    GGUFFile.open, and GGUFFile.from_bytes(header_only=True) of the same bytes
    each tensor's data and rows views, rows picked by id (embedding_rows-style) and dequantized
        with inference.quants.dequantize_rows, GGUFTensor.dequantize, inference.quants.dequantize
    `llamatui inspect --json PATH` and `llamatui inspect PATH` (in-process, through cli.main)

A case passes when every stage either succeeds, with results that agree with each other (the
rows dequantized one by one equal the same rows of the whole tensor, shapes and byte counts
add up), or ends in a GGUFError; the CLI then prints that error as one line and exits 1. The one
other error allowed is inference.quants' own UnsupportedTypeError, from calling its dequantize
directly on a tensor type that llamatui cannot dequantize (and only then).

    cases = make_cases(seed=26, n=1500)   # seeded: the same cases every run
    results = run_cases(26, 1500, tmp_dir)   # in one worker process; a crash or hang fails a case
    print(summary(results)); assert not failures(results)

Cases run in a worker process with an address-space limit, so a bug that allocates what a
hostile dimension asks for fails the case instead of taking the machine down.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import selectors
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from llamatui.inference.catalog import GGML_TYPES_BY_ID
from llamatui.inference.quants import SUPPORTED_TYPES

CASE_TIMEOUT_S = 20.0
STARTUP_TIMEOUT_S = 600.0  # the worker's first start may compile kernels (cold numba cache)
WORKER_ADDRESS_SPACE = 4 << 30

ALIGNMENT = 32
# ggml's types, as the reader knows them (llama.cpp's ggml.h), and llamatui's dequantizers
TYPE_IDS = {t.name: t.id for t in GGML_TYPES_BY_ID.values()}
BLOCKS = {t.name: (t.block_size, t.type_size) for t in GGML_TYPES_BY_ID.values()}
# ids no ggml type has (4 and 5 were Q4_2 and Q4_3, 31-33 Q4_0_4_4 and friends, all removed)
UNKNOWN_TYPE_IDS = tuple(i for i in (4, 5, 31, 32, 33, 36, 37, 38, 42, 43, 99, 255, 1 << 16,
                                     (1 << 31) - 1, 1 << 31, (1 << 32) - 1)
                         if i not in GGML_TYPES_BY_ID)
# known to ggml, not to llamatui's dequantizers
UNSUPPORTED_TYPES = tuple(sorted(set(TYPE_IDS) - set(SUPPORTED_TYPES)))

# the base file's tensors: (name, type, ne in ggml order, fastest first)
BASE_TENSORS = (
    ("token_embd.weight", "Q8_0", [64, 12]),
    ("blk.0.attn_norm.weight", "F32", [64]),
    ("blk.0.attn_q.weight", "F16", [64, 8]),
    ("blk.0.attn_k.weight", "BF16", [32, 4]),
    ("blk.0.attn_v.weight", "Q4_0", [64, 3]),
    ("blk.0.ffn_up.weight", "Q4_K", [256, 3]),
    ("blk.0.ffn_down.weight", "Q6_K", [256, 2]),
    ("blk.0.ffn_gate.weight", "Q5_1", [32, 2, 1]),
    ("blk.0.ffn_up_exps.weight", "IQ4_NL", [32, 3, 2]),
    ("blk.0.attn_sinks", "F32", [4, 2, 2, 2]),
    ("blk.0.scale", "F32", []),  # n_dims 0: a scalar (ggml's ne all 1)
    ("output.weight", "Q2_K", [256, 2]),
    ("rope_freqs.weight", "I32", [8]),
)

U32, I32, U64, F32, BOOL, STRING, ARRAY, F64 = 4, 5, 10, 6, 7, 8, 9, 12

# values a u64 dimension or offset is set to: zero, huge, "negative" as int64
ZERO_HUGE = (0, 1 << 31, 1 << 32, 1 << 40, 1 << 53, 1 << 61, 1 << 62, (1 << 63) - 1, 1 << 63,
             (1 << 64) - 256, (1 << 64) - 1)
# dimension lists whose product overflows int64 (or wraps to something small in u64)
OVERFLOWS = ([1 << 32, 1 << 32], [1 << 21, 1 << 21, 1 << 21], [(1 << 62), 2],
             [256, (1 << 56) + 4], [64, (1 << 58) + 1], [1 << 16, 1 << 16, 1 << 16, 1 << 16],
             [3, 3074457345618258603], [32, 1 << 59], [256, 1 << 55, 2])

KINDS = ("zero_dim", "huge_dim", "overflow", "too_many_dims", "n_dims", "offset", "misaligned",
         "overlap", "unknown_type", "unsupported_type", "other_type", "partial_block",
         "duplicate", "truncate", "alignment", "count", "nested", "valid")


# ----------------------------------------------------------------------------- the raw file

def _string(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value) -> bytes:
    """One metadata value; arrays are ("array", element type, items), nested to any depth."""
    if vtype == STRING:
        return _string(value)
    if vtype != ARRAY:
        return struct.pack({U32: "<I", I32: "<i", U64: "<Q", F32: "<f", BOOL: "<?",
                            F64: "<d"}[vtype], value)
    _, etype, items = value
    body = struct.pack("<IQ", etype, len(items))
    if etype == ARRAY:
        return body + b"".join(_value(ARRAY, item) for item in items)
    return body + b"".join(_value(etype, item) for item in items)


@dataclass
class Info:
    """One tensor-info entry, as written: `n_dims` may disagree with `ne` (a lie)."""
    name: str
    ne: list
    type_id: int
    offset: int
    n_dims: int | None = None  # None: len(ne)

    def encode(self) -> bytes:
        n_dims = len(self.ne) if self.n_dims is None else self.n_dims
        return _string(self.name) + struct.pack(f"<I{len(self.ne)}QIQ", n_dims, *self.ne,
                                                self.type_id, self.offset)


def _padding(n: int, alignment: int) -> int:
    return -n % alignment


@dataclass
class Model:
    """A file under construction: metadata [(key, type, value)], tensor infos, data bytes."""
    metadata: list
    infos: list
    data: bytes
    alignment: int = ALIGNMENT
    count_delta: int = 0  # added to the tensor count written in the header

    def encode(self) -> bytes:
        kv = b"".join(_string(k) + struct.pack("<I", t) + _value(t, v)
                      for k, t, v in self.metadata)
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.infos) + self.count_delta,
                                     len(self.metadata))
        head += kv + b"".join(i.encode() for i in self.infos)
        return head + b"\0" * _padding(len(head), self.alignment) + self.data


_FINITE_MASKS = {"F16": (np.uint16, 0xBBFF), "BF16": (np.uint16, 0xBF7F),
                 "F32": (np.uint32, 0xBF7FFFFF)}


def base_model(rng: random.Random) -> Model:
    """The valid base: every tensor of BASE_TENSORS with random bytes, aligned, in order."""
    metadata = [("general.architecture", STRING, "llama"), ("general.name", STRING, "fuzz"),
                ("general.alignment", U32, ALIGNMENT),
                ("tokenizer.ggml.tokens", ARRAY, ("array", STRING, ["a", "b", "c"]))]
    infos, data = [], bytearray()
    for name, ttype, ne in BASE_TENSORS:
        block, size = BLOCKS[ttype]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * size
        infos.append(Info(name, list(ne), TYPE_IDS[ttype], len(data)))
        chunk = np.frombuffer(rng.randbytes(nbytes), np.uint8).copy()
        if ttype in _FINITE_MASKS:  # exponents below the maximum: finite values only
            dtype, mask = _FINITE_MASKS[ttype]
            chunk = chunk.view(dtype) & dtype(mask)
        chunk = chunk.tobytes()
        data += chunk + b"\0" * _padding(nbytes, ALIGNMENT)
    return Model(metadata, infos, bytes(data))


# ----------------------------------------------------------------------------- mutations

@dataclass
class Case:
    index: int
    kinds: list = field(default_factory=list)
    edits: list = field(default_factory=list)
    label: str = ""


def _nested_value(rng: random.Random, depth: int):
    """A nested array of mixed depth: inner arrays of numbers, strings or further arrays, some
    empty, some longer than inspect's summary head."""
    if depth == 0 or rng.random() < 0.3:
        etype = rng.choice([I32, U32, F32, STRING, BOOL, F64])
        n = rng.choice([0, 1, 2, 3, 9, 12])
        items = {STRING: lambda i: rng.choice(["a", "", "\udcff", "x y"]),
                 BOOL: lambda i: rng.random() < 0.5,
                 F32: lambda i: rng.choice([0.5, float("nan"), float("inf"), -1.0]),
                 F64: lambda i: rng.choice([1e300, float("-inf"), 2.5]),
                 U32: lambda i: rng.randrange(1 << 32),
                 I32: lambda i: rng.randrange(-(1 << 31), 1 << 31)}[etype]
        return ("array", etype, [items(i) for i in range(n)])
    n = rng.choice([0, 1, 2, 3, 10])
    return ("array", ARRAY, [_nested_value(rng, depth - 1) for _ in range(n)])


def _edit(rng: random.Random, kind: str, n_tensors: int) -> tuple:
    t = rng.randrange(n_tensors)
    if kind == "zero_dim":  # alone, or beside a huge one (0 elements: no overflow to see)
        return (kind, t, rng.randrange(4), 0, rng.randrange(4), rng.choice((1,) + ZERO_HUGE[1:]))
    if kind == "huge_dim":
        return (kind, t, rng.randrange(4), rng.choice(ZERO_HUGE[1:]))
    if kind == "overflow":
        return (kind, t, list(rng.choice(OVERFLOWS)))
    if kind == "too_many_dims":
        n = rng.choice([5, 6, 8, 16, 255, 1 << 16, (1 << 32) - 1])
        return (kind, t, n, rng.random() < 0.5)  # True: write that many dims (1s)
    if kind == "n_dims":  # a valid shape written with trailing 1s, or fewer dims than it has
        return (kind, t, rng.choice(["pad", "drop", "flatten", "zero"]))
    if kind == "offset":
        return (kind, t, rng.choice(["end", "end+", "last", "huge", "wrap", "tail"]),
                rng.choice(ZERO_HUGE))
    if kind == "misaligned":
        return (kind, t, rng.choice([1, 2, 4, 8, 16, 31]))
    if kind == "overlap":
        return (kind, t, rng.randrange(n_tensors))
    if kind == "unknown_type":
        return (kind, t, rng.choice(UNKNOWN_TYPE_IDS))
    if kind == "unsupported_type":
        return (kind, t, TYPE_IDS[rng.choice(UNSUPPORTED_TYPES)])
    if kind == "other_type":
        return (kind, t, rng.choice(sorted(TYPE_IDS.values())))
    if kind == "partial_block":
        return (kind, t, rng.choice([-1, 1, 16, 100, 255]))
    if kind == "duplicate":
        return (kind, t, rng.randrange(n_tensors))
    if kind == "truncate":
        return (kind, rng.choice([1, 16, 32, 100, 1000, 4000]))
    if kind == "alignment":
        return (kind, rng.choice([1, 2, 8, 16, 64, 128, 4096, 3, 0, 48, 1 << 31]),
                rng.random() < 0.5)  # True: offsets re-laid out for it
    if kind == "count":
        return (kind, rng.choice([-1, 1, 2, -3]))
    if kind == "nested":
        return (kind, rng.choice(["general.nested", "tokenizer.ggml.tokens", "x.deep"]),
                _nested_value(rng, rng.randint(1, 5)))
    return ("valid", t, rng.choice(["pad", "reorder"]))


def make_cases(seed: int, n: int) -> list[Case]:
    """n seeded cases; each applies one edit, some two or three."""
    rng = random.Random(seed)
    cases = []
    for index in range(n):
        case = Case(index)
        for _ in range(1 if rng.random() < 0.75 else rng.randint(2, 3)):
            kind = KINDS[index % len(KINDS)] if not case.kinds else rng.choice(KINDS)
            case.kinds.append(kind)
            case.edits.append(_edit(rng, kind, len(BASE_TENSORS)))
        case.label = f"#{index}: " + "; ".join(_describe(e) for e in case.edits)
        cases.append(case)
    return cases


def _describe(edit) -> str:
    if edit[0] == "nested":
        return f"nested {edit[1]} = {str(edit[2])[:80]}"
    return " ".join(map(str, edit))


def _nbytes(info: Info) -> int:
    """The tensor's size from its infos when they are sane (for laying offsets out)."""
    name = next((k for k, v in TYPE_IDS.items() if v == info.type_id), None)
    if name is None:
        return 0
    block, size = BLOCKS[name]
    n = 1
    for d in info.ne:
        n *= d
    return n // block * size if 0 <= n < 1 << 40 else 0


def _relayout(model: Model, alignment: int) -> None:
    """Offsets recomputed for `alignment`, data padded accordingly (from the base's bytes)."""
    data, new = model.data, bytearray()
    for info in model.infos:
        n = _nbytes(info)
        chunk = data[info.offset:info.offset + n] if info.offset < len(data) else b""
        info.offset = len(new)
        new += chunk + b"\0" * (n - len(chunk)) + b"\0" * _padding(n, alignment)
    model.data = bytes(new)


def apply(case: Case, seed: int = 0) -> Model:
    model = base_model(random.Random(seed * 1_000_003 + case.index))
    infos = model.infos
    for edit in case.edits:
        kind = edit[0]
        info = infos[edit[1] % len(infos)] if isinstance(edit[1], int) and \
            kind not in ("truncate", "alignment", "count") and infos else None
        if kind in ("zero_dim", "huge_dim"):
            d = min(edit[2], len(info.ne))
            info.ne[d:d + 1] = [edit[3]]
            if kind == "zero_dim" and edit[4] != d:
                d = min(edit[4], len(info.ne))
                info.ne[d:d + 1] = [edit[5]]
        elif kind == "overflow":
            info.ne = list(edit[2])
        elif kind == "too_many_dims":
            info.n_dims = edit[2]
            if edit[3] and edit[2] <= 16:
                info.ne = info.ne + [1] * (edit[2] - len(info.ne))
        elif kind == "n_dims":
            n = 1
            for d in info.ne:
                n *= d
            if edit[2] == "pad":
                info.ne = info.ne + [1] * (4 - len(info.ne))
            elif edit[2] == "drop" and info.ne:
                info.ne = info.ne[:-1]
            elif edit[2] == "flatten":
                info.ne = [n]
            else:
                info.ne = []
        elif kind == "offset":
            how, value = edit[2], edit[3]
            end = len(model.data)
            info.offset = {"end": end, "end+": end + ALIGNMENT, "last": end - ALIGNMENT,
                           "huge": value - value % ALIGNMENT, "wrap": (1 << 64) - ALIGNMENT,
                           "tail": max(0, end - _nbytes(info) + ALIGNMENT)}[how]
            info.offset -= info.offset % ALIGNMENT
        elif kind == "misaligned":
            info.offset += edit[2]
        elif kind == "overlap":
            info.offset = infos[edit[2] % len(infos)].offset
        elif kind in ("unknown_type", "unsupported_type", "other_type"):
            info.type_id = edit[2]
        elif kind == "partial_block":
            if info.ne:
                info.ne[0] = max(1, info.ne[0] + edit[2])
        elif kind == "duplicate":
            info.name = infos[edit[2] % len(infos)].name
        elif kind == "truncate":
            model.data = model.data[:max(0, len(model.data) - edit[1])]
        elif kind == "alignment":
            model.metadata = [(k, t, edit[1] if k == "general.alignment" else v)
                              for k, t, v in model.metadata]
            model.alignment = edit[1] if edit[1] in (1, 2, 8, 16, 64, 128, 4096) else ALIGNMENT
            if edit[2] and edit[1] in (1, 2, 8, 16, 64, 128, 4096):
                _relayout(model, edit[1])
        elif kind == "count":
            model.count_delta += edit[1]
        elif kind == "nested":
            model.metadata = [m for m in model.metadata if m[0] != edit[1]]
            model.metadata.append((edit[1], ARRAY, edit[2]))
        elif kind == "valid":
            if edit[2] == "pad":
                info.ne = info.ne + [1] * (4 - len(info.ne))
            else:
                infos.reverse()
    return model


# ----------------------------------------------------------------------------- the stages

def _check_tensor(t, out: dict) -> None:
    """Every read of one tensor; what they return must agree."""
    from llamatui.inference.quants import UnsupportedTypeError, dequantize, dequantize_rows
    data = t.data
    assert data.nbytes == t.nbytes and data.dtype == np.uint8, (t, data.nbytes)
    rows = t.rows
    assert rows.ndim == 2 and rows.size == t.nbytes, (t, rows.shape)
    row_length = t.shape[-1] if t.shape else 1
    assert rows.shape[0] * row_length == t.n_elements, (t, rows.shape)
    supported = t.type in SUPPORTED_TYPES
    try:
        flat = dequantize(t.type, data, t.n_elements)
    except UnsupportedTypeError:
        assert not supported, t
        out["unsupported"] = out.get("unsupported", 0) + 1
        flat = None
    else:
        assert supported and flat.shape == (t.n_elements,), t
    whole = t.dequantize()  # GGUFTensor's own: a GGUFError for an unsupported type
    assert whole.shape == t.shape and whole.dtype == np.float32, (t, whole.shape)
    assert np.array_equal(whole.reshape(-1), flat, equal_nan=True), t
    ids = np.unique([0, rows.shape[0] // 2, rows.shape[0] - 1])
    picked = dequantize_rows(t.type, rows[ids], row_length)  # embedding_rows-style access
    assert np.array_equal(picked, whole.reshape(-1, row_length)[ids], equal_nan=True), t
    out["dequantized"] = out.get("dequantized", 0) + 1


def _stage_open(path: str, out: dict):
    """GGUFFile.open; and the same bytes parsed as a header alone (as a download's first bytes
    are), which must succeed too when the whole file opens, and otherwise end in a GGUFError."""
    from llamatui.inference.gguf import GGUFError, GGUFFile
    data = pathlib.Path(path).read_bytes()
    try:
        GGUFFile.from_bytes(data, name=path, header_only=True).close()
        header_ok = True
    except GGUFError:
        header_ok = False
    f = GGUFFile.open(path)
    assert header_ok, "the file opens but its header alone does not"
    out["tensors"] = len(f.tensors)
    return f


def _stage_tensors(f, out: dict) -> None:
    from llamatui.inference.gguf import GGUFError
    for t in f.tensors.values():
        try:
            _check_tensor(t, out)
        except GGUFError as e:
            # The reader accepted the tensor, so only a type it cannot dequantize may fail.
            assert t.type not in SUPPORTED_TYPES and t.name in str(e), (t, e)


def _stage_inspect(path: str, open_error: str | None, out: dict) -> None:
    import contextlib
    import io

    from llamatui.app.cli import main
    for argv in (["inspect", "--json", path], ["inspect", path]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(argv)
        if open_error is None:
            assert rc == 0 and not stderr.getvalue(), (argv, rc, stderr.getvalue()[-500:])
            if "--json" in argv:
                info = json.loads(stdout.getvalue())
                assert info["totals"]["n_tensors"] == out["tensors"]
        else:
            assert rc == 1, (argv, rc)
            assert stderr.getvalue() == f"llamatui inspect: error: {open_error}\n", \
                (stderr.getvalue()[-500:], open_error)


def _failure(stage: str, e: BaseException) -> dict:
    import traceback
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return {"stage": stage, "type": type(e).__name__, "message": str(e)[:300],
            "where": f"{pathlib.Path(tb.filename).name}:{tb.lineno}"}


def run_one(path: str) -> dict:
    """{"outcome": "ok" | "rejected" | "failure", "error": the GGUFError message when rejected,
    "failures": [{stage, type, message, where}], counts}. Each stage runs even when an earlier
    one failed, so that one defect does not hide another."""
    from llamatui.inference.gguf import GGUFError
    out: dict = {"outcome": "ok", "failures": []}
    f = None
    try:
        f = _stage_open(path, out)
    except GGUFError as e:
        out.update(outcome="rejected", error=str(e))
    except (Exception, MemoryError) as e:  # noqa: BLE001 - classified, that is the point
        out["failures"].append(_failure("open", e))
    if f is not None:
        with f:
            try:
                _stage_tensors(f, out)
            except (Exception, MemoryError) as e:  # noqa: BLE001
                out["failures"].append(_failure("tensors", e))
    try:
        _stage_inspect(path, out.get("error"), out)
    except (Exception, MemoryError) as e:  # noqa: BLE001
        out["failures"].append(_failure("inspect", e))
    if out["failures"]:
        out["outcome"] = "failure"
    return out


def worker_main() -> None:
    """argv: seed n start directory; answers one JSON line per case from `start` on."""
    import resource
    import warnings
    warnings.simplefilter("ignore")
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_ADDRESS_SPACE, WORKER_ADDRESS_SPACE))
    seed, n, start, directory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cases = make_cases(seed, n)
    warm = pathlib.Path(directory, "warm.gguf")  # compile/load every kernel before timing
    warm.write_bytes(base_model(random.Random(0)).encode())
    result = run_one(str(warm))
    print(json.dumps({"ready": result["outcome"] == "ok", "warmup": result}), flush=True)
    for case in cases[start:]:
        path = pathlib.Path(directory, f"case-{case.index}.gguf")
        path.write_bytes(apply(case, seed).encode())
        t0 = time.monotonic()
        result = run_one(str(path))
        result.update(index=case.index, seconds=time.monotonic() - t0)
        path.unlink()
        print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- the runner

@dataclass
class Result:
    case: Case
    outcome: str  # "ok", "rejected", "failure"
    detail: dict


def _read_line(proc, buf: bytearray, timeout: float):
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def _start(seed: int, n: int, start: int, directory: str):
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    here = str(pathlib.Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import tensor_info_fuzz; tensor_info_fuzz.worker_main()",
         str(seed), str(n), str(start), directory], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    buf = bytearray()
    ready = _read_line(proc, buf, STARTUP_TIMEOUT_S)
    if not ready or not ready.get("ready"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the fuzz worker did not start: {ready}")
    return proc, buf


def run_cases(seed: int, n: int, directory) -> list[Result]:
    """Runs make_cases(seed, n) in a worker process; a case that crashes or hangs it is a
    failure, and a fresh worker goes on from the next case."""
    cases = make_cases(seed, n)
    results: list[Result] = []
    while len(results) < n:
        proc, buf = _start(seed, n, len(results), str(directory))
        try:
            while len(results) < n:
                answer = _read_line(proc, buf, CASE_TIMEOUT_S)
                case = cases[len(results)]
                if answer is None:
                    results.append(Result(case, "failure", {"failures": [{
                        "stage": "?", "type": "crash or hang",
                        "message": f"no answer in {CASE_TIMEOUT_S:.0f} s"}]}))
                    break
                assert answer["index"] == case.index, answer
                results.append(Result(case, answer["outcome"], answer))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
    return results


def summary(results: list[Result]) -> str:
    by_kind: dict[str, Counter] = {}
    for r in results:
        for kind in set(r.case.kinds):
            by_kind.setdefault(kind, Counter())[r.outcome] += 1
    total = Counter(r.outcome for r in results)
    lines = [f"{len(results)} cases: " + ", ".join(f"{k} {v}" for k, v in total.most_common())]
    for kind in KINDS:
        c = by_kind.get(kind, Counter())
        lines.append(f"  {kind:17s} ok {c['ok']:4d}  rejected {c['rejected']:4d}  failure "
                     f"{c['failure']:4d}")
    return "\n".join(lines)


def failures(results: list[Result]) -> list[str]:
    """One line per failed stage: the case, then stage: exception: message (where)."""
    return [f"{r.case.label[:200]}\n    {f['stage']}: {f['type']}: {f['message']} "
            f"({f.get('where')})" for r in results for f in r.detail.get("failures", ())]


if __name__ == "__main__":  # python tests/tensor_info_fuzz.py [N] [SEED]: a run with a report
    import re
    import tempfile
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 26
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        res = run_cases(seed, n, tmp)
        print(summary(res))
        print(f"{time.monotonic() - t0:.1f} s")
        seen: Counter = Counter()
        for text in failures(res):
            sig = re.sub(r"\d+", "N", text.split("\n    ")[1])[:120]
            seen[sig] += 1
            if seen[sig] <= 2:
                print("FAIL", text)
        print("\n".join(f"{v:5d} {k}" for k, v in seen.most_common()))
