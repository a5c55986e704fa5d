"""Split GGUF models (llama.cpp's gguf-split layout): written by GGUFWriter.write_split, opened as
one model from the first shard, checked shard by shard like llama_model_loader does."""
import hashlib
import json
import mmap
import os

import gguf as gguf_py
import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference.gguf import (GGUFError, GGUFFile, GGUFValueType, GGUFWriter, split_path,
                                     split_prefix)

SPLIT_KEYS = ("split.no", "split.tensors.count", "split.count")  # in the order gguf-split writes
# sha256 of the shards llama.cpp's llama-gguf-split (tools/gguf-split of the reference checkout,
# llama.cpp 0.6.0) wrote from the SmolLM2 starter model with `--split-max-tensors 100` and with
# `--split-max-size 40M`, recorded by hand: our shards must be the same bytes.
LLAMA_GGUF_SPLIT_SHA256 = {
    "max_tensors": ["5d7783b09193c99f8c0d5de487430a75b2d89decfa54aa55fcdfafcef8aa0aeb",
                    "c0a0cd044665ed2568fd6f32c24b62ada9667f46c4c823d08a0470c1e89f518e",
                    "5d705b914de8d237db555cb19bd2fe478b5a64c8e6fb8f58702aa813381a2f9d"],
    "max_bytes": ["3f5ab9ffa02a0f8eb50435b7929dbbb5e5ecff012bd90426ccc5eb6b90f02e49",
                  "248ceca2b27c2b7eced896a10a3ddb7114b4da82d4e6c4b40272b459993fd369",
                  "4b40b6cdaa9b35a97fd697b3ca413ac89c1df12347da6916d72bc8cc56fa7bc9"],
}


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _writer_from(src: GGUFFile, prefix) -> GGUFWriter:
    w = GGUFWriter(prefix, alignment=src.alignment, version=src.version)
    w.add_metadata(src.metadata)
    for t in src.tensors.values():
        w.add_tensor(t.name, t.type, t.shape, t.data)
    return w


@pytest.fixture(scope="module")
def smollm2_shards(smollm2_path, tmp_path_factory):
    """SmolLM2 (272 tensors) in 3 shards of at most 100 tensors, as
    `llama-gguf-split --split-max-tensors 100 SmolLM2.gguf .../SmolLM2` would write it."""
    prefix = tmp_path_factory.mktemp("split") / "SmolLM2"
    with GGUFFile.open(smollm2_path) as src:
        return [os.fspath(p) for p in _writer_from(src, prefix).write_split(max_tensors=100)]


def _mapping_of(array: np.ndarray):
    while isinstance(array, np.ndarray):
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_shards_follow_gguf_split_layout(smollm2_path, smollm2_shards):
    assert [os.path.basename(p) for p in smollm2_shards] == [
        f"SmolLM2-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with GGUFFile.open(smollm2_path) as whole:
        names = list(whole.tensors)
        keys = list(whole.metadata)
    seen = []
    for no, path in enumerate(smollm2_shards):
        with GGUFFile.open(path, join_splits=False) as shard:
            md = shard.metadata
            assert [md[k] for k in SPLIT_KEYS] == [no, 272, 3]
            assert [md.types[k].type for k in SPLIT_KEYS] == [
                GGUFValueType.UINT16, GGUFValueType.INT32, GGUFValueType.UINT16]
            # all the metadata in the first shard (split keys last), only split keys elsewhere
            assert list(md) == (keys if no == 0 else []) + list(SPLIT_KEYS)
            seen += list(shard.tensors)
            assert len(shard.tensors) == (100 if no < 2 else 72)
        # gguf-py, an independent reader, reads each shard the same
        ref = gguf_py.GGUFReader(path)
        assert ref.fields["split.no"].contents() == no
        assert [t.name for t in ref.tensors] == seen[-len(ref.tensors):]
    assert seen == names  # in the original order
    assert [_sha256(p) for p in smollm2_shards] == LLAMA_GGUF_SPLIT_SHA256["max_tensors"]


def test_first_shard_opens_the_whole_model(smollm2_path, smollm2_shards):
    with GGUFFile.open(smollm2_path) as whole, GGUFFile.open(smollm2_shards[0]) as split:
        assert split.shard_paths == smollm2_shards
        assert split.file_size == sum(os.path.getsize(p) for p in smollm2_shards)
        assert list(split.tensors) == list(whole.tensors)
        for name, t in whole.tensors.items():
            s = split.tensors[name]
            assert (s.type, s.shape, s.nbytes) == (t.type, t.shape, t.nbytes)
            assert np.array_equal(s.data, t.data), name
        # zero-copy: each tensor is a view of its own shard's mapping
        shard_maps = {s.shard: _mapping_of(s.data) for s in split.tensors.values()}
        assert sorted(shard_maps) == [0, 1, 2]
        assert all(isinstance(m, mmap.mmap) for m in shard_maps.values())
        assert len({id(m) for m in shard_maps.values()}) == 3
        assert [k for k in split.metadata if k not in SPLIT_KEYS] == list(whole.metadata)
        for key in whole.metadata:
            a, b = whole.metadata[key], split.metadata[key]
            assert (a.tolist() if isinstance(a, np.ndarray) else a) == \
                   (b.tolist() if isinstance(b, np.ndarray) else b), key


def test_split_model_gives_the_same_logits(smollm2_path, smollm2_shards):
    from llamatui.inference import Engine
    ids = [1, 9690, 314, 253, 1345, 30]
    with Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, warmup=False)) as whole:
        expected = whole.logits(ids)
    with Engine.load(smollm2_shards[0], LoadConfig(n_ctx=64, threads=2, warmup=False)) as split:
        assert split.info.file_bytes == sum(os.path.getsize(p) for p in smollm2_shards)
        got = split.logits(ids)
    assert np.array_equal(got, expected)


def test_split_by_size_like_split_max_size(smollm2_path, tmp_path):
    limit = 30_000_000
    with GGUFFile.open(smollm2_path) as src:
        w = _writer_from(src, tmp_path / "m.gguf")
        paths = w.write_split(max_bytes=40_000_000)
        # a tensor over the limit (token_embd: Q8_0, 30,081,024 bytes) gets a shard of its own,
        # where llama-gguf-split gives up
        small_paths = w.write_split(max_bytes=limit)
    assert [os.path.basename(p) for p in paths] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [_sha256(p) for p in paths] == LLAMA_GGUF_SPLIT_SHA256["max_bytes"]
    sizes = []
    for path in small_paths:
        with GGUFFile.open(path, join_splits=False) as shard:
            sizes.append(sum(-(-t.nbytes // 32) * 32 for t in shard.tensors.values()))
            assert sizes[-1] <= limit or list(shard.tensors) == ["token_embd.weight"]
    assert len(sizes) == 4 and min(sizes[1:-1]) > 0.95 * limit  # filled before a new one


def test_our_reader_opens_shards_written_by_gguf_py(tmp_path):
    w = gguf_py.GGUFWriter(tmp_path / "ref.gguf", "llama", split_max_tensors=2)
    w.add_block_count(1)
    arrays = {f"t{i}": np.arange(8, dtype=np.float32) * i for i in range(5)}
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    first = tmp_path / "ref-00001-of-00003.gguf"
    with GGUFFile.open(first) as f:
        assert len(f.shard_paths) == 3 and f.metadata["llama.block_count"] == 1
        assert {n: t.dequantize().tolist() for n, t in f.tensors.items()} == \
               {n: a.tolist() for n, a in arrays.items()}


def test_split_with_custom_alignment(tmp_path):
    w = GGUFWriter(tmp_path / "a")
    w.add("general.alignment", 64, GGUFValueType.UINT32)
    for i in range(3):
        w.add_tensor(f"t{i}", "F32", (3,), np.full(3, i, np.float32))
    paths = w.write_split(max_tensors=1)
    for path in paths:
        with GGUFFile.open(path, join_splits=False) as shard:
            assert shard.alignment == 64 and shard.data_offset % 64 == 0
    with GGUFFile.open(paths[0]) as f:
        assert [t.dequantize().tolist() for t in f.tensors.values()] == [[0] * 3, [1] * 3, [2] * 3]


def test_split_names_follow_llama_split_path():
    assert split_path("/m/x", 0, 3) == "/m/x-00001-of-00003.gguf"
    assert split_prefix("/m/x-00002-of-00003.gguf", 1, 3) == "/m/x"
    assert split_prefix("/m/x-00002-of-00003.gguf", 0, 3) is None  # not shard 1
    assert split_prefix("-00001-of-00003.gguf", 0, 3) is None  # no prefix


# ----------------------------------------------------------------------------- errors


def _tiny_split(tmp_path, n=3, shard=-1, **split_keys) -> list:
    """A 3-tensor model in `n` shards; `split_keys` (split_count=4 for split.count) override
    values in one shard."""
    w = GGUFWriter(tmp_path / "tiny")
    w.add("general.architecture", "llama")
    for i in range(3):
        w.add_tensor(f"t{i}", "F32", (4,), np.full(4, i, np.float32))
    paths = w.write_split(max_tensors=-(-3 // n))
    if split_keys:
        with GGUFFile.open(paths[shard], join_splits=False) as f:
            redo = GGUFWriter(paths[shard] + ".new")
            redo.add_metadata(f.metadata)
            for key, value in split_keys.items():
                key = key.replace("_", ".")
                redo.add(key, value, f.metadata.types[key])
            for t in f.tensors.values():
                redo.add_tensor(t.name, t.type, t.shape, t.data)
            redo.write()
        os.replace(paths[shard] + ".new", paths[shard])
    return paths


def _open_error(path, match) -> str:
    with pytest.raises(GGUFError, match=match) as e:
        GGUFFile.open(path)
    return str(e.value)


def test_missing_shard_is_named(tmp_path):
    paths = _tiny_split(tmp_path)
    os.remove(paths[1])
    err = _open_error(paths[0], "shard 2 of 3 is missing")
    assert err.endswith(paths[1])


def test_mismatched_split_count_is_named(tmp_path):
    paths = _tiny_split(tmp_path, split_count=4)
    err = _open_error(paths[0], "split.count is 4")
    assert err.startswith(paths[2]) and "says 3" in err


def test_a_plain_file_in_place_of_a_shard(tmp_path):
    paths = _tiny_split(tmp_path)
    w = GGUFWriter(paths[1])
    w.add_tensor("t1", "F32", (4,), np.ones(4, np.float32))
    w.write()
    err = _open_error(paths[0], "no split.count, so not shard 2 of the 3")
    assert err.startswith(paths[1])


def test_shards_out_of_order(tmp_path):
    paths = _tiny_split(tmp_path)
    os.replace(paths[1], tmp_path / "x")
    os.replace(paths[2], paths[1])
    err = _open_error(paths[0], "split.no is 2, expected 1")
    assert err.startswith(paths[1])


def test_wrong_tensor_total(tmp_path):
    paths = _tiny_split(tmp_path, shard=0, split_tensors_count=4)  # llama.cpp reads the first's
    _open_error(paths[0], "split.tensors.count is 4 but the 3 shards hold 3 tensors")


def test_other_shard_or_renamed_first_shard(tmp_path):
    paths = _tiny_split(tmp_path)
    err = _open_error(paths[1], "shard 2 of 3 of a split model; open its first shard")
    assert paths[0] in err
    with GGUFFile.open(paths[1], join_splits=False) as alone:
        assert list(alone.tensors) == ["t1"]
    os.replace(paths[0], tmp_path / "renamed.gguf")
    _open_error(tmp_path / "renamed.gguf", "does not end in -00001-of-00003.gguf")


def test_writer_split_arguments_and_failure(tmp_path):
    w = GGUFWriter(tmp_path / "m")
    w.add_tensor_info("a", "F32", (4,))
    w.add_tensor_info("b", "F32", (4,))
    for bad in ({}, {"max_tensors": 1, "max_bytes": 10}, {"max_tensors": -1}):
        with pytest.raises(ValueError, match="one of max_tensors and max_bytes"):
            w.write_split(**bad)

    def source(name):  # the second shard's tensor cannot be produced
        if name == "b":
            raise OSError("source vanished")
        return np.zeros(4, np.float32)

    with pytest.raises(OSError, match="vanished"):
        w.write_split(max_tensors=1, tensor_source=source)
    assert list(tmp_path.iterdir()) == []  # neither shard, nor a temporary


def test_inspect_shows_the_whole_split_model(smollm2_path, smollm2_shards, capsys):
    from llamatui.app.cli import main
    assert main(["inspect", smollm2_shards[0], "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shards"] == smollm2_shards
    assert info["totals"]["n_tensors"] == 272
    assert info["totals"]["parameters"] == 134_515_008
    assert info["totals"]["file_bytes"] == sum(os.path.getsize(p) for p in smollm2_shards)
    assert {t["shard"] for t in info["tensors"]} == {0, 1, 2}
    assert main(["inspect", smollm2_shards[0]]) == 0
    out = capsys.readouterr().out
    assert "split in 3 shards: SmolLM2-00001-of-00003.gguf" in out and "output_norm" in out
    assert main(["inspect", smollm2_shards[2]]) == 1
    err = capsys.readouterr().err
    assert "shard 3 of 3" in err and "Traceback" not in err
