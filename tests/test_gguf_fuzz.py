"""Hostile GGUF headers: thousands of seeded mutations and truncations of the real models' headers,
and of their tensor infos field by field. Every one either opens (and then every value and tensor
can be read) or raises GGUFError."""
import random
import struct

import numpy as np
import pytest

from llamatui.inference.gguf import GGUFError, GGUFFile, GGUFWriter
from llamatui.inference.quants import SUPPORTED_TYPES, dequantize_rows

EXTREMES_64 = [0, 1, 0xFF, 0xFFFF_FFFF, 1 << 31, 1 << 32, 1 << 62, (1 << 63) - 1, 1 << 63,
               (1 << 64) - 1]


def _corpus(model_path, tmp_path, n_tensors: int) -> tuple[bytes, int]:
    """The model's real metadata and tensor infos, with only the first few tensors' data, as
    bytes; and where its tensor-info table starts."""
    with GGUFFile.open(model_path) as f:
        w = GGUFWriter(tmp_path / "corpus.gguf", alignment=f.alignment)
        w.add_metadata(f.metadata)
        small = sorted(f.tensors.values(), key=lambda t: t.nbytes)[:n_tensors]
        for t in small:
            w.add_tensor(t.name, t.type, t.shape, t.data)
        w.write()
        first_name = small[0].name.encode()
    data = (tmp_path / "corpus.gguf").read_bytes()
    return data, data.index(struct.pack("<Q", len(first_name)) + first_name)


def _mutate(rng: random.Random, data: bytes, info_start: int) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # truncate anywhere
        return bytes(buf[:rng.randrange(len(buf))])
    # where: the fixed header and first keys, the tensor-info table, or anywhere
    region = rng.choice([(0, min(4096, len(buf))), (info_start, len(buf)), (0, len(buf))])
    pos = rng.randrange(*region)
    if kind == 1:  # flip random bits in a few bytes
        for _ in range(rng.randint(1, 8)):
            p = min(len(buf) - 1, pos + rng.randrange(16))
            buf[p] ^= 1 << rng.randrange(8)
    elif kind == 2 and pos + 8 <= len(buf):  # a u64 field (count, length, dim, offset) gone wild
        struct.pack_into("<Q", buf, pos, rng.choice(EXTREMES_64))
    elif kind == 3 and pos + 4 <= len(buf):  # a u32 field (type, n_dims, version)
        struct.pack_into("<I", buf, pos, rng.choice([0, 1, 2, 3, 4, 9, 12, 13, 39, 40, 255,
                                                     0xFFFF_FFFF]))
    elif kind == 4:  # bytes inserted or deleted: everything after shifts
        if rng.random() < 0.5:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        else:
            del buf[pos:pos + rng.randint(1, 9)]
    else:  # a random 8-byte splat
        buf[pos:pos + 8] = rng.randbytes(8)
    return bytes(buf)


def _exercise(f: GGUFFile) -> None:
    for key in f.metadata:
        f.metadata[key]
    for t in f.tensors.values():
        assert t.data.nbytes == t.nbytes
        assert t.rows.shape[0] * t.row_length == t.n_elements
        if t.type in SUPPORTED_TYPES and t.nbytes < 1 << 20:
            whole = t.dequantize()
            assert whole.shape == t.shape
            last = t.rows[-1:]  # a row picked as embedding lookups do
            assert np.array_equal(dequantize_rows(t.type, last, t.row_length)[0],
                                  whole.reshape(-1, t.row_length)[-1], equal_nan=True)


@pytest.mark.parametrize("model, n_mutations, seed", [("smollm2", 1800, 1234), ("gemma3", 250, 99)])
def test_mutated_headers_open_or_raise_gguf_error(model, n_mutations, seed, smollm2_path,
                                                  gemma3_path, tmp_path):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[model]
    data, info_start = _corpus(path, tmp_path, n_tensors=6)
    _exercise(GGUFFile.from_bytes(data))  # the unmutated corpus is valid
    rng = random.Random(seed)
    outcomes = {"opened": 0, "rejected": 0}
    for i in range(n_mutations):
        mutated = _mutate(rng, data, info_start)
        try:
            f = GGUFFile.from_bytes(mutated, name=f"mutation {i}")
        except GGUFError as e:
            assert str(e).startswith(f"mutation {i}: ")
            outcomes["rejected"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - any other exception is the bug we look for
            pytest.fail(f"mutation {i} (seed {seed}) raised {type(e).__name__}: {e}")
        _exercise(f)
        outcomes["opened"] += 1
    print(model, outcomes)
    # Both outcomes occur, so the mutations reach past the magic check and into real parsing.
    assert outcomes["opened"] > n_mutations // 20 and outcomes["rejected"] > n_mutations // 4


def _tensor_info_fields(data: bytes, names: list[str]) -> list[tuple[str, int, str]]:
    """(field, position, struct format) of every field of the named tensors' infos: n_dims, each
    dimension, the type and the offset."""
    fields = []
    for name in names:
        pos = data.rindex(struct.pack("<Q", len(name.encode())) + name.encode()) + 8 + len(name)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        fields.append(("n_dims", pos, "<I"))
        fields += [("dim", pos + 4 + 8 * d, "<Q") for d in range(n_dims)]
        fields += [("type", pos + 4 + 8 * n_dims, "<I"), ("offset", pos + 8 + 8 * n_dims, "<Q")]
    return fields


# per field, what it is set to: zero, huge, overflowing, "negative" as int64; ranks past 4;
# unknown, unsupported and other types; offsets misaligned, past the end, wrapping around
FIELD_VALUES = {
    "n_dims": [0, 1, 2, 3, 4, 5, 8, 64, 1 << 16, 0xFFFF_FFFF],
    "dim": [0, 1, 2, 31, 33, 255, 1 << 31, 1 << 32, 1 << 61, 1 << 62, (1 << 63) - 1, 1 << 63,
            (1 << 64) - 1, 3074457345618258603],
    "type": [0, 1, 2, 3, 4, 5, 8, 9, 12, 14, 16, 26, 28, 31, 36, 39, 40, 41, 42, 0xFFFF_FFFF],
    "offset": [0, 1, 16, 32, 1 << 20, 1 << 32, (1 << 63) - 32, 1 << 63, (1 << 64) - 32,
               (1 << 64) - 1],
}


@pytest.mark.parametrize("model, n_mutations, seed", [("smollm2", 1500, 5), ("gemma3", 300, 6)])
def test_mutated_tensor_infos_open_or_raise_gguf_error(model, n_mutations, seed, smollm2_path,
                                                       gemma3_path, tmp_path):
    """One to three fields of the real tensor infos set to extremes: the file opens and every
    tensor reads, rows and dequantizes as its shape says, or the reader names the problem."""
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[model]
    data, _ = _corpus(path, tmp_path, n_tensors=6)
    with GGUFFile.from_bytes(data) as f:
        fields = _tensor_info_fields(data, list(f.tensors))
    rng = random.Random(seed)
    outcomes = {"opened": 0, "rejected": 0}
    for i in range(n_mutations):
        buf = bytearray(data)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            kind, pos, fmt = rng.choice(fields)
            struct.pack_into(fmt, buf, pos, rng.choice(FIELD_VALUES[kind]))
        try:
            f = GGUFFile.from_bytes(bytes(buf), name=f"mutation {i}")
        except GGUFError as e:
            assert str(e).startswith(f"mutation {i}: ")
            outcomes["rejected"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - any other exception is the bug we look for
            pytest.fail(f"mutation {i} (seed {seed}) raised {type(e).__name__}: {e}")
        try:
            _exercise(f)
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"mutation {i} (seed {seed}) opened, then raised {type(e).__name__}: {e}")
        outcomes["opened"] += 1
    print(model, outcomes)
    assert outcomes["opened"] > n_mutations // 20 and outcomes["rejected"] > n_mutations // 2


def test_mutated_split_shards_open_or_raise_gguf_error(smollm2_path, tmp_path):
    """A small model in 3 shards (llama.cpp's split layout); one shard at a time is mutated on
    disk and the first shard opened: the whole model opens, or a GGUFError names a shard."""
    with GGUFFile.open(smollm2_path) as f:
        w = GGUFWriter(tmp_path / "m", alignment=f.alignment)
        w.add("general.architecture", "llama")
        for t in sorted(f.tensors.values(), key=lambda t: t.nbytes)[:6]:
            w.add_tensor(t.name, t.type, t.shape, t.data)
        paths = w.write_split(max_tensors=2)
    originals = [open(p, "rb").read() for p in paths]
    rng = random.Random(7)
    outcomes = {"opened": 0, "rejected": 0}
    for i in range(600):
        k = rng.randrange(3)
        with open(paths[k], "wb") as out:
            out.write(_mutate(rng, originals[k], 24))
        try:
            with GGUFFile.open(paths[0]) as f:
                _exercise(f)
            outcomes["opened"] += 1
        except GGUFError as e:
            assert str(e).startswith(tuple(paths)), e
            outcomes["rejected"] += 1
        except Exception as e:  # noqa: BLE001 - any other exception is the bug we look for
            pytest.fail(f"mutation {i} of shard {k + 1} raised {type(e).__name__}: {e}")
        with open(paths[k], "wb") as out:
            out.write(originals[k])
    print(outcomes)
    assert outcomes["opened"] > 100 and outcomes["rejected"] > 100  # both paths are reached


def test_file_truncated_on_disk(smollm2_path, tmp_path):
    data = smollm2_path.read_bytes()
    for n in (3, 24, 1000, 1_500_000, len(data) - 1000):
        (tmp_path / "t.gguf").write_bytes(data[:n])
        with pytest.raises(GGUFError, match=str(tmp_path / "t.gguf")):
            GGUFFile.open(tmp_path / "t.gguf")
    with pytest.raises(GGUFError, match="empty"):
        (tmp_path / "e.gguf").write_bytes(b"")
        GGUFFile.open(tmp_path / "e.gguf")
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile.open(tmp_path)
    assert np.array_equal(np.frombuffer(data[:4], np.uint8), np.frombuffer(b"GGUF", np.uint8))
