"""GGUF reading, writing and validation, checked against gguf-py and the real starter models."""
import filecmp
import json
import struct

import numpy as np
import pytest
from gguf import GGUFReader

from llamatui.inference.gguf import (GGUFError, GGUFFile, GGUFValueType, GGUFWriter, ValueType)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_path(request, smollm2_path, gemma3_path):
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}[request.param]


def test_metadata_and_tensors_match_gguf_py(smollm2_path):
    # gguf-py takes tens of seconds on Gemma's 262k-entry vocabulary, so it checks SmolLM2 here;
    # Gemma's parse is checked by the byte-identical round trip and the values below.
    model_path = smollm2_path
    ref = GGUFReader(model_path)
    with GGUFFile.open(model_path) as f:
        ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == ref_keys
        for key in ref_keys:
            expected = ref.fields[key].contents()
            ours = f.metadata[key]
            if isinstance(ours, np.ndarray):
                ours = ours.tolist()
            if isinstance(expected, float):
                assert ours == pytest.approx(expected, rel=1e-7), key
            else:
                assert ours == expected, key
        assert [t.name for t in ref.tensors] == list(f.tensors)
        for rt in ref.tensors:
            t = f.tensors[rt.name]
            assert t.type == rt.tensor_type.name
            assert t.shape == tuple(int(d) for d in reversed(rt.shape))
            assert t.nbytes == rt.n_bytes
            assert t.offset == rt.data_offset
            assert np.shares_memory(t.data, t.data)  # a view, not a copy
            assert t.data.base is not None


def test_gemma3_header(gemma3_path):
    from collections import Counter
    with GGUFFile.open(gemma3_path) as f:
        md = f.metadata
        assert (md["general.architecture"], md["gemma3.block_count"], md["gemma3.embedding_length"],
                md["gemma3.attention.sliding_window"]) == ("gemma3", 18, 640, 512)
        assert md["gemma3.rope.freq_base"] == 1e6
        tokens = md["tokenizer.ggml.tokens"]
        assert len(tokens) == len(md["tokenizer.ggml.scores"]) == 262144
        assert tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
        assert Counter(t.type for t in f.tensors.values()) == {
            "F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
        emb = f.tensors["token_embd.weight"]
        assert (emb.type, emb.shape, emb.nbytes) == ("Q8_0", (262144, 640), 262144 * 20 * 34)


def test_read_write_is_byte_identical(model_path, tmp_path):
    out = tmp_path / "copy.gguf"
    with GGUFFile.open(model_path) as f:
        w = GGUFWriter(out, alignment=f.alignment, version=f.version)
        w.add_metadata(f.metadata)
        for t in f.tensors.values():
            w.add_tensor(t.name, t.type, t.shape, t.data)
        w.write()
    assert filecmp.cmp(model_path, out, shallow=False)
    assert [p.name for p in tmp_path.iterdir()] == ["copy.gguf"]  # no temporary left behind


def test_open_without_mmap_reads_same_tensors(smollm2_path):
    with GGUFFile.open(smollm2_path) as a, GGUFFile.open(smollm2_path, use_mmap=False) as b:
        name = "blk.3.ffn_up.weight"
        assert np.array_equal(a.tensors[name].data, b.tensors[name].data)
        assert a.metadata["general.architecture"] == b.metadata["general.architecture"] == "llama"


def test_tensor_rows_view(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        t = f.tensors["blk.0.ffn_gate.weight"]  # Q4_1, 1536 rows of 576
        assert t.shape == (1536, 576)
        assert t.rows.shape == (1536, 576 // 32 * 20)


def _small_file(tmp_path, **kw):
    w = GGUFWriter(tmp_path / "small.gguf", **kw)
    w.add("general.architecture", "llama")
    w.add("u8", 7, GGUFValueType.UINT8)
    w.add("i64", -5, GGUFValueType.INT64)
    w.add("f64", 0.25, GGUFValueType.FLOAT64)
    w.add("flag", True)
    w.add("names", ["a", "", "é\u2581"])
    w.add("floats", np.array([1.5, -2.0], np.float32))
    w.add("nested", [[1, 2], [3]], ValueType(GGUFValueType.ARRAY,
                                              ValueType(GGUFValueType.ARRAY,
                                                        ValueType(GGUFValueType.INT32))))
    w.add_tensor("a", "F32", (2, 3), np.arange(6, dtype=np.float32))
    w.add_tensor("b", "Q8_0", (1, 32), np.zeros(34, np.uint8))
    w.write()
    return tmp_path / "small.gguf"


def test_all_value_types_round_trip(tmp_path):
    path = _small_file(tmp_path)
    with GGUFFile.open(path) as f:
        md = f.metadata
        assert md["u8"] == 7 and md.types["u8"].type == GGUFValueType.UINT8
        assert md["i64"] == -5 and md["f64"] == 0.25 and md["flag"] is True
        assert md["names"] == ["a", "", "é\u2581"]
        assert md["floats"].tolist() == [1.5, -2.0]
        assert [x.tolist() for x in md["nested"]] == [[1, 2], [3]]
        assert f.tensors["a"].dequantize().tolist() == [[0, 1, 2], [3, 4, 5]]
        assert f.tensors["b"].offset % 32 == 0
    ref = GGUFReader(path)
    assert ref.fields["names"].contents() == ["a", "", "é\u2581"]
    # gguf-py reads our nested array's layout (its contents() flattens nested arrays)
    assert ref.fields["nested"].contents() == [1, 2, 3]


def test_custom_alignment(tmp_path):
    w = GGUFWriter(tmp_path / "a.gguf")
    w.add("general.alignment", 64, GGUFValueType.UINT32)
    w.add_tensor("x", "F32", (3,), np.ones(3, np.float32))
    w.add_tensor("y", "F32", (5,), np.ones(5, np.float32))
    w.write()
    with GGUFFile.open(tmp_path / "a.gguf") as f:
        assert f.alignment == 64
        assert f.data_offset % 64 == 0 and f.tensors["y"].offset % 64 == 0
        assert f.tensors["y"].dequantize().tolist() == [1] * 5


def test_header_only_parse(smollm2_path):
    head = smollm2_path.read_bytes()[:2_000_000]
    f = GGUFFile.from_bytes(head, header_only=True)
    assert f.metadata["llama.block_count"] == 30
    assert len(f.tensors) == 272
    with pytest.raises(GGUFError, match="not available"):
        f.tensors["output_norm.weight"].data


def _patched(path, offset, fmt, value):
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def _error(data: bytes) -> str:
    with pytest.raises(GGUFError) as e:
        GGUFFile.from_bytes(data)
    return str(e.value)


def test_specific_errors(tmp_path):
    path = _small_file(tmp_path)
    good = path.read_bytes()
    assert "magic" in _error(b"GGML" + good[4:])
    assert "unsupported GGUF version 1" in _error(_patched(path, 4, "<I", 1))
    assert "tensor count" in _error(_patched(path, 8, "<Q", 1 << 40))
    assert "metadata count" in _error(_patched(path, 16, "<Q", 1 << 40))
    assert "cannot fit" in _error(good[:30])
    assert "truncated file: length of key of metadata entry 5" in _error(good[:150])
    assert "metadata 'names': a string in the array runs past" in _error(good[:200])
    # first key's length
    assert "runs past the end" in _error(_patched(path, 24, "<Q", 1 << 50))
    # first key's value type: key "general.architecture" is 20 bytes after its 8-byte length
    assert "unknown metadata value type 99" in _error(_patched(path, 24 + 8 + 20, "<I", 99))
    assert "empty" in _error(b"")


def _tensor_info_offset(data: bytes, name: bytes) -> int:
    """Position just after a tensor's name in the tensor-info table."""
    i = data.rindex(struct.pack("<Q", len(name)) + name)
    return i + 8 + len(name)


def test_tensor_errors(tmp_path):
    path = _small_file(tmp_path)
    good = path.read_bytes()
    pos = _tensor_info_offset(good, b"b")  # b: n_dims=2, ne=(32, 1), type Q8_0, offset
    ne0, type_pos, off_pos = pos + 4, pos + 4 + 16, pos + 4 + 16 + 4

    def patched(offset, fmt, value):
        data = bytearray(good)
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)

    assert "dimensions" in _error(patched(pos, "<I", 9))
    assert "unknown ggml type 77" in _error(patched(type_pos, "<I", 77))
    assert "not a multiple" in _error(patched(ne0, "<Q", 33))
    assert "overflow" in _error(patched(ne0 + 8, "<Q", 1 << 62))
    assert "not aligned" in _error(patched(off_pos, "<Q", 8))
    assert "outside the file" in _error(patched(off_pos, "<Q", 1 << 20))
    assert "overlap" in _error(patched(off_pos, "<Q", 0))
    assert "outside the file" in _error(good[:-40])


def test_tensor_info_checks_name_the_tensor_and_the_problem(tmp_path):
    """The tensor-info checks that keep hostile shapes out of numpy (as llama.cpp's
    gguf_init_from_file_impl, and every dimension at least 1)."""
    good = _small_file(tmp_path).read_bytes()
    pos = _tensor_info_offset(good, b"b")  # b: n_dims=2, ne=(32, 1), type Q8_0, offset 32
    ne0, ne1, type_pos, off_pos = pos + 4, pos + 12, pos + 4 + 16, pos + 4 + 16 + 4

    def error(*patches):
        data = bytearray(good)
        for offset, fmt, value in patches:
            struct.pack_into(fmt, data, offset, value)
        return _error(bytes(data))

    at = f"(at offset {pos - 9})"  # where b's entry starts: its name's length
    assert error((ne0, "<Q", 0)) == \
        f"<bytes>: tensor 'b': dimension 0 is 0 (every dimension must be at least 1) {at}"
    # a zero dimension beside a huge one: 0 elements, so no overflow would show
    assert "dimension 1 is 0" in error((ne0, "<Q", 1 << 62), (ne1, "<Q", 0))
    assert error((ne1, "<Q", 1 << 63)) == \
        f"<bytes>: tensor 'b': dimension 1 is {1 << 63}, more than int64 holds {at}"
    assert error((ne1, "<Q", (1 << 63) - 1)) == (
        f"<bytes>: tensor 'b': dimensions [32, {(1 << 63) - 1}] overflow int64 "
        f"({32 * ((1 << 63) - 1)} elements) {at}")
    # 2**62 F64 values fit int64 as a count, not as bytes
    assert error((ne1, "<Q", 1 << 57), (type_pos, "<I", 28)) == (
        f"<bytes>: tensor 'b': {1 << 62} elements of F64 take {1 << 65} bytes, more than int64 "
        f"holds {at}")
    assert error((pos, "<I", 5)) == f"<bytes>: tensor 'b' has 5 dimensions (at most 4) {at}"
    assert error((off_pos, "<Q", 1 << 20)) == (
        "<bytes>: tensor 'b': data offset 1048576 lies outside the file (past the 96 bytes of "
        f"its data section) {at}")
    assert error((off_pos, "<Q", 64)) == \
        f"<bytes>: tensor 'b': data [{len(good) - 96 + 64}, {len(good) - 96 + 98}) lies " \
        f"outside the file ({len(good)} bytes) {at}"


def test_a_tensor_of_no_dimensions_is_one_value(tmp_path):
    w = GGUFWriter(tmp_path / "s.gguf")
    w.add_tensor("s", "F32", (), np.array(2.5, np.float32))
    w.add_tensor("v", "F32", (1,), np.array([1.5], np.float32))
    w.write()
    data = (tmp_path / "s.gguf").read_bytes()
    with GGUFFile.open(tmp_path / "s.gguf") as f:
        s = f.tensors["s"]
        assert (s.shape, s.n_elements, s.nbytes, s.row_length) == ((), 1, 4, 1)
        assert s.rows.shape == (1, 4) and s.dequantize().shape == ()
        assert float(s.dequantize()) == 2.5
    # as ggml, its row is one value: no whole block of a quantized type
    pos = _tensor_info_offset(data, b"s")
    patched = bytearray(data)
    struct.pack_into("<I", patched, pos + 4, 8)  # type Q8_0
    assert "tensor 's': row length 1 is not a multiple of the Q8_0 block size 32" in \
        _error(bytes(patched))
    with pytest.raises(ValueError, match="rows of 1 values cannot hold Q8_0"):
        GGUFWriter(tmp_path / "q.gguf").add_tensor_info("s", "Q8_0", ())


def test_writer_refuses_shapes_the_reader_refuses(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf")
    for shape in [(0, 32), (4, 0), (1, 1, 1, 1, 32), (-1, 32)]:
        with pytest.raises(ValueError, match=r"at most 4 dimensions, each at least 1"):
            w.add_tensor_info("t", "F32", shape)


def test_a_type_without_dequantizer_is_named_with_its_tensor(tmp_path):
    w = GGUFWriter(tmp_path / "i.gguf")
    w.add_tensor("ids", "I32", (2, 4), np.arange(8, dtype=np.int32))
    w.write()
    with GGUFFile.open(tmp_path / "i.gguf") as f:
        t = f.tensors["ids"]
        assert t.rows.view(np.int32).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        with pytest.raises(GGUFError, match="tensor 'ids': tensor type 'I32' is a ggml type "
                                            "llamatui cannot dequantize"):
            t.dequantize()


def test_arrays_of_arrays_of_different_types(tmp_path):
    """Each inner array keeps its own type; the outer one declares none for them (one would
    misdescribe the others), and a copy writes the same bytes."""
    A = GGUFValueType.ARRAY
    mixed = [np.array([1, 2], np.int32), ["a", "b"], [np.array([1.5], np.float32)]]
    w = GGUFWriter(tmp_path / "m.gguf")
    w.add("mixed", mixed)
    w.add("depths", [[np.array([1], np.int32)], []])
    w.add("same", [np.array([1], np.uint8), np.array([2, 3], np.uint8)])
    w.write()
    with GGUFFile.open(tmp_path / "m.gguf") as f:
        assert f.metadata.types["mixed"] == ValueType(A, ValueType(A))
        assert f.metadata.types["same"] == ValueType(A, ValueType(A, ValueType(
            GGUFValueType.UINT8)))
        got = f.metadata["mixed"]
        assert got[0].dtype == np.int32 and got[0].tolist() == [1, 2]
        assert got[1] == ["a", "b"] and got[2][0].dtype == np.float32
        copy = GGUFWriter(tmp_path / "c.gguf")
        copy.add_metadata(f.metadata)
        copy.write()
    assert filecmp.cmp(tmp_path / "m.gguf", tmp_path / "c.gguf", shallow=False)


def test_writer_rejects_wrong_sizes(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="bytes"):
        w.add_tensor("t", "Q4_0", (1, 32), np.zeros(17, np.uint8))
    with pytest.raises(ValueError, match="bytes"):
        w.add_tensor("t", "Q4_0", (1, 31), np.zeros(18, np.uint8))


def test_failed_write_leaves_nothing(tmp_path):
    w = GGUFWriter(tmp_path / "out.gguf")
    w.add("bad", object.__new__(object), ValueType(GGUFValueType.UINT32))
    with pytest.raises(Exception):
        w.write()
    assert list(tmp_path.iterdir()) == []


def _nested(*types):
    """ValueType of arrays nested around an element type: _nested(ARRAY, ARRAY, INT32)."""
    vtype = ValueType(types[-1])
    for t in reversed(types[:-1]):
        vtype = ValueType(t, vtype)
    return vtype


def test_inspect_json_holds_every_value_type(tmp_path, capsys):
    from llamatui.app.cli import main
    A, S = GGUFValueType.ARRAY, GGUFValueType.STRING
    w = GGUFWriter(tmp_path / "values.gguf")
    w.add("general.architecture", "llama")
    w.add("nested.ints", [[1, 2], [], [3]], _nested(A, A, GGUFValueType.INT32))
    w.add("nested.strings", [["a", "b"], ["c"]], _nested(A, A, S))
    w.add("nested.deep", [[[1.5, float("nan")]], [[float("inf"), -float("inf")]]],
          _nested(A, A, A, GGUFValueType.FLOAT64))
    w.add("nested.long", [list(range(i)) for i in range(10)], _nested(A, A, GGUFValueType.UINT8))
    w.add("nested.bools", [[True, False]], _nested(A, A, GGUFValueType.BOOL))
    w.add("big.u64", (1 << 64) - 1, GGUFValueType.UINT64)
    w.add("big.i64", -(1 << 63), GGUFValueType.INT64)
    w.add("nan.f32", float("nan"), GGUFValueType.FLOAT32)
    w.add("floats", np.array([np.nan, 1.0, -np.inf], np.float32))
    w.add("bad.utf8", b"ok\xff".decode("utf-8", "surrogateescape"))
    w.add_tensor("x", "F32", (2,), np.zeros(2, np.float32))
    w.write()

    assert main(["inspect", str(tmp_path / "values.gguf"), "--json"]) == 0
    out = capsys.readouterr().out

    def no_constants(name):
        raise AssertionError(f"{name} is not valid JSON")
    md = json.loads(out, parse_constant=no_constants)["metadata"]
    assert md["nested.ints"] == [[1, 2], [], [3]]
    assert md["nested.strings"] == [["a", "b"], ["c"]]
    assert md["nested.deep"] == [[[1.5, "NaN"]], [["Infinity", "-Infinity"]]]
    assert md["nested.long"]["length"] == 10 and md["nested.long"]["array_of"] == "ARRAY"
    assert md["nested.long"]["head"][3] == [0, 1, 2]
    assert md["nested.bools"] == [[True, False]]
    assert md["big.u64"] == (1 << 64) - 1 and md["big.i64"] == -(1 << 63)
    assert md["nan.f32"] == "NaN" and md["floats"] == ["NaN", 1.0, "-Infinity"]
    assert md["bad.utf8"] == "ok\ufffd"
    assert main(["inspect", str(tmp_path / "values.gguf")]) == 0  # the table shows them too
    table = capsys.readouterr().out
    assert "nested.deep" in table and "Infinity" in table


def test_inspect_prints_arrays_of_arrays_of_different_types(tmp_path, capsys):
    from llamatui.app.cli import main
    w = GGUFWriter(tmp_path / "mixed.gguf")
    w.add("mixed", [np.array([1, 2], np.int32), ["a", "b"], [np.array([1.5], np.float32)]])
    w.add("mixed.depths", [[np.array([1], np.int32)], []])
    w.add("mixed.long", [np.arange(10, dtype=np.uint8), ["x"] * 12, [np.array([7], np.int8)]])
    w.write()
    path = str(tmp_path / "mixed.gguf")

    assert main(["inspect", "--json", path]) == 0
    md = json.loads(capsys.readouterr().out)["metadata"]
    assert md["mixed"] == [[1, 2], ["a", "b"], [[1.5]]]
    assert md["mixed.depths"] == [[[1]], []]
    assert md["mixed.long"] == [
        {"array_of": "UINT8", "length": 10, "head": list(range(8))},
        {"array_of": "STRING", "length": 12, "head": ["x"] * 8}, [[7]]]

    assert main(["inspect", path]) == 0
    table = capsys.readouterr().out
    assert "[[1, 2], ['a', 'b'], [[1.5]]]" in table
    assert "[[[1]], []]" in table
    assert "[[10 × UINT8] [0, 1, 2, 3, 4, 5, 6, 7] …, [12 × STRING] ['x', " in table
