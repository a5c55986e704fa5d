"""The KV cache: cells and sequences, storage types, position shifts (K-shift)."""
import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference.cpu import ops
from llamatui.inference.gguf import GGUFFile
from llamatui.inference.kv_cache import KVCache, KVCacheFullError, KVRows
from llamatui.inference.model import Batch, Model
from llamatui.inference.quants import dequantize_rows
from llamatui.inference.rope import RopeSpec, Yarn


def _cache(n_ctx=16, n_seq_max=3, type_k="f32", type_v="f32", neox=False, rope=None):
    rope = rope or [RopeSpec(32, 10000.0, 1.0, neox), RopeSpec(32, 1e6, 0.5, neox)]
    return KVCache(n_ctx, len(rope), KVRows(2, 32, 32, type_k, type_v), n_seq_max,
                   layer_rope=rope)


def _store(kv, positions, seq):
    cells = kv.find_slots(len(positions))
    kv.store_cells(cells, np.asarray(positions), [(seq,) if np.isscalar(seq) else seq] *
                   len(positions))
    return cells


# ----------------------------------------------------------------------------- cells, sequences


def test_cells_accounting():
    kv = _cache()
    assert kv.n_ctx == 16 and kv.used_cells == 0 and kv.n_kv() == 0
    assert kv.seq_pos_max(0) == -1
    cells = kv.find_slots(5)
    assert cells.tolist() == [0, 1, 2, 3, 4] and kv.used_cells == 0  # finding claims nothing
    _store(kv, range(5), 0)
    _store(kv, range(3), 1)
    assert kv.used_cells == 8 and kv.n_kv() == 8
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0), kv.seq_pos_max(1)) == (0, 4, 2)
    assert kv.seq_rm(0, 1, 3)  # positions 1, 2 of seq 0
    assert kv.used_cells == 6 and kv.seq_pos_max(0) == 4
    assert kv.find_slots(3).tolist() == [1, 2, 8]  # freed cells are reused first
    with pytest.raises(KVCacheFullError):
        kv.find_slots(11)
    kv.seq_rm(1)  # whole sequence
    assert kv.used_cells == 3 and kv.seq_pos_max(1) == -1
    kv.seq_rm(-1, 4)  # every sequence from position 4 on
    assert kv.used_cells == 2 and kv.seq_pos_max(0) == 3
    kv.clear()
    assert kv.used_cells == 0
    with pytest.raises(ValueError):
        kv.seq_rm(3)


def test_seq_cp_keep_and_shared_cells():
    kv = _cache()
    _store(kv, range(6), 0)
    kv.seq_cp(0, 1, 0, 4)  # seq 1 shares positions 0..3
    kv.seq_cp(0, 2)  # seq 2 shares everything
    assert kv.used_cells == 6
    assert kv.seq_pos_max(1) == 3 and kv.seq_pos_max(2) == 5
    kv.seq_rm(0)
    assert kv.used_cells == 6  # still held by seqs 1 and 2
    kv.seq_rm(2, 4)
    assert kv.used_cells == 4
    _store(kv, [4, 5], 1)
    _store(kv, [4], 2)
    assert kv.used_cells == 7
    kv.seq_keep(2)
    assert kv.used_cells == 5 and kv.seq_pos_max(1) == -1 and kv.seq_pos_max(2) == 4


def test_mask_follows_sequences_positions_and_window():
    kv = _cache()
    _store(kv, range(4), 0)
    _store(kv, range(2), 1)
    cells = _store(kv, [4], 0)
    m = kv.mask(np.array([4]), np.array([0]), kv.n_kv())
    assert cells.tolist() == [6]
    assert (m[0] == 0).tolist() == [True] * 4 + [False, False, True]
    m = kv.mask(np.array([2]), np.array([0]), kv.n_kv())  # causal: not after position 2
    assert (m[0] == 0).tolist() == [True, True, True, False, False, False, False]
    m = kv.mask(np.array([4]), np.array([0]), kv.n_kv(), n_swa=2)  # 4 - p < 2
    assert (m[0] == 0).tolist() == [False, False, False, True, False, False, True]
    assert np.isneginf(m[m != 0]).all()


def test_seq_add_shifts_positions_and_frees_cells_below_zero():
    kv = _cache()
    _store(kv, range(8), 0)
    kv.seq_add(0, 5, -1, -3)  # positions 5, 6, 7 -> 2, 3, 4
    assert sorted(kv.pos[kv.pos >= 0].tolist()) == [0, 1, 2, 2, 3, 3, 4, 4]
    kv.seq_add(0, 0, 2, -1)  # 0 -> -1 (freed), 1 -> 0
    assert kv.used_cells == 7 and kv.seq_pos_min(0) == 0
    kv.seq_add(0, -1, -1, 10)
    assert kv.seq_pos_min(0) == 10 and kv.seq_pos_max(0) == 14


def _yarn_and_longrope(neox):
    """A YaRN layer (4x over 8 positions) and one with LongRoPE-style factors and magnitude."""
    factors = np.linspace(1.0, 4.0, 16).astype(np.float32)
    return [RopeSpec(32, 10000.0, 0.25, neox, yarn=Yarn(n_ctx_orig=8, ext_factor=1.0)),
            RopeSpec(32, 10000.0, 1.0, neox, factors, attn_factor=1.2)]


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_k_shift_equals_roping_at_the_new_positions(neox, scaled):
    """Shifted K is the K roped at the new positions, with YaRN and magnitudes too (these
    multiply cos and sin: a shift must turn K without scaling it again)."""
    rng = np.random.default_rng(0)
    kv = _cache(neox=neox, rope=_yarn_and_longrope(neox) if scaled else None)
    pos = np.arange(10, 18)
    raw_k = [rng.standard_normal((8, 2, 32)).astype(np.float32) for _ in range(2)]
    v = [rng.standard_normal((8, 2, 32)).astype(np.float32) for _ in range(2)]
    cells = _store(kv, pos, 0)
    for il in range(2):
        kv.write(il, cells, ops.rope_apply(raw_k[il].copy(), pos, kv.layer_rope[il]), v[il])
    kv.seq_add(0, 12, -1, -7)
    new_pos = np.where(pos >= 12, pos - 7, pos)
    assert kv.pos[cells].tolist() == new_pos.tolist()
    for il in range(2):
        k, vv = kv.read_f32(il, kv.n_kv())
        want = ops.rope_apply(raw_k[il].copy(), new_pos, kv.layer_rope[il])
        np.testing.assert_allclose(k[cells], want, atol=5e-5)
        np.testing.assert_array_equal(vv[cells], v[il])


def test_k_shift_leaves_the_layers_without_rope_alone():
    """SmolLM3's NoPE layers (a None RoPE spec) keep their K through a shift."""
    rng = np.random.default_rng(1)
    kv = _cache(rope=[RopeSpec(32, 10000.0), None])
    pos = np.arange(6)
    k = [rng.standard_normal((6, 2, 32)).astype(np.float32) for _ in range(2)]
    cells = _store(kv, pos, 0)
    for il in range(2):
        kv.write(il, cells, k[il], k[il])
    kv.seq_add(0, 2, -1, 5)
    np.testing.assert_array_equal(kv.read_f32(1, kv.n_kv())[0][cells], k[1])
    assert not np.allclose(kv.read_f32(0, kv.n_kv())[0][cells][2:], k[0][2:])


def test_unknown_cache_type_and_sequence_ids():
    with pytest.raises(ValueError, match="q8_0"):
        _cache(type_k="q4_0")
    kv = _cache(n_seq_max=2)
    with pytest.raises(ValueError):
        kv.store_cells(kv.find_slots(1), [0], [(2,)])


# ----------------------------------------------------------------------------- storage types


def test_q8_0_rows_are_ggml_bytes(golden_dir):
    vectors = np.load(golden_dir / "quant_vectors.npz")
    x = vectors["x"]
    q = ops.quantize_q8_0_rows(x)
    np.testing.assert_array_equal(q, vectors["Q8_0"])
    np.testing.assert_array_equal(ops.dequantize_q8_0_rows(q, x.shape[1]),
                                  dequantize_rows("Q8_0", q, x.shape[1]))
    f16 = ops.f32_to_f16_bits(x[:24])  # the real weights (the synthetic rows overflow fp16)
    np.testing.assert_array_equal(f16.view(np.uint8), vectors["F16"][:24])
    np.testing.assert_array_equal(ops.f16_bits_to_f32(f16), x[:24].astype(np.float16))


def test_q8_0_round_trip_error_bound():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    x[3, 32:64] = 0.0  # an all-zero block
    x[5, :32] = 7.5  # a constant block
    y = ops.dequantize_q8_0_rows(ops.quantize_q8_0_rows(x), 256)
    d = np.abs(x.reshape(64, 8, 32)).max(axis=2, keepdims=True) / 127
    err = np.abs(y - x).reshape(64, 8, 32)
    assert (err <= d * (0.5 + 127 * 2.0 ** -11) + 1e-30).all()
    assert (y[3, 32:64] == 0).all()
    np.testing.assert_allclose(y[5, :32], 7.5, rtol=1e-3)


@pytest.mark.parametrize("type_name, tol, bytes_per_value",
                         [("f32", 0.0, 4), ("f16", 1e-3, 2), ("q8_0", 1.2e-2, 34 / 32)])
def test_storage_types_round_trip(type_name, tol, bytes_per_value):
    rng = np.random.default_rng(2)
    kv = _cache(type_k=type_name, type_v=type_name)
    assert kv.nbytes == 2 * 2 * 16 * 64 * bytes_per_value  # K+V, 2 layers, 16 cells, 64 values
    k = rng.standard_normal((5, 2, 32)).astype(np.float32)
    v = rng.standard_normal((5, 2, 32)).astype(np.float32)
    cells = _store(kv, range(5), 0)
    kv.write(1, cells, k, v)
    k2, v2 = kv.read_f32(1, kv.n_kv())
    assert k2.shape == (5, 2, 32) and k2.dtype == np.float32
    raw_k, _ = kv.read(1, kv.n_kv())  # what attention gets: fp16 bits for f16, else float32
    assert raw_k.dtype == (np.uint16 if type_name == "f16" else np.float32)
    scale = np.abs(k).max()
    assert np.abs(k2 - k).max() <= tol * scale and np.abs(v2 - v).max() <= tol * scale


# ----------------------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def smollm2_seq(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        yield Model.load(f, LoadConfig(n_ctx=160, cache_type_k="f32", cache_type_v="f32",
                                       n_parallel=3))


def _close(a, b, rel=2e-3):
    """Equal up to float32 summation-order noise (a batch and single tokens take different BLAS
    paths; Gemma amplifies that to ~1e-3 of its largest logit)."""
    return np.abs(a - b).max() <= rel * max(1.0, np.abs(b).max())


@pytest.mark.usefixtures("float32_products")
def test_sequences_share_one_cache(smollm2_seq, golden_smollm2):
    model = smollm2_seq
    a = golden_smollm2["greedy"][0]["prompt_ids"]
    b = golden_smollm2["greedy"][3]["prompt_ids"]
    ref_a = model.logits_for(a + [1000, 2000])
    ref_b = model.logits_for(b + [3000])
    model.kv.clear()
    # both prompts in one batch, one output each
    logits = model.decode(Batch(a + b, pos=list(range(len(a))) + list(range(len(b))),
                                seq_ids=[0] * len(a) + [1] * len(b),
                                logits=[i in (len(a) - 1, len(a) + len(b) - 1)
                                        for i in range(len(a) + len(b))]))
    assert _close(logits[0], ref_a[len(a) - 1]) and _close(logits[1], ref_b[len(b) - 1])
    assert model.kv.used_cells == len(a) + len(b)
    # seq 2 branches off seq 0's prompt
    model.kv.seq_cp(0, 2)
    assert model.kv.used_cells == len(a) + len(b)
    # one step of each sequence in one batch (positions continue per sequence)
    step = model.decode(Batch([1000, 3000, 1000], seq_ids=[0, 1, 2], logits=True))
    assert _close(step[0], ref_a[len(a)]) and _close(step[1], ref_b[len(b)])
    assert _close(step[2], ref_a[len(a)])
    # seq 2 goes its own way
    out = model.decode(Batch([2000], seq_ids=2))
    assert _close(out[0], ref_a[len(a) + 1])
    model.kv.seq_rm(1)
    assert model.kv.used_cells == len(a) + 1 + 2  # shared prompt, seq 0's step, seq 2's two steps
    model.kv.seq_keep(2)
    assert model.kv.used_cells == len(a) + 2
    out = model.decode(Batch([5], seq_ids=2))  # still continues after the cleanup
    assert out.shape == (1, model.n_vocab)


def _log_softmax(row):
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def shift_case(request):
    which = request.param
    run = request.getfixturevalue(f"golden_{which}")["greedy"][7]
    with GGUFFile.open(request.getfixturevalue(f"{which}_path")) as f:
        model = Model.load(f, LoadConfig(n_ctx=128, cache_type_k="f32", cache_type_v="f32"))
    ids = run["prompt_ids"] + run["tokens"][:12]
    return model, ids, run["tokens"][12]


@pytest.mark.usefixtures("float32_products")
@pytest.mark.parametrize("offset, delta", [(0, 37), (60, -60)])
def test_shifted_sequence_equals_evaluation_at_the_new_positions(shift_case, offset, delta):
    """RoPE attention only sees position differences, so a whole sequence moved by `delta`
    (K re-roped in the cache, with each layer's own RoPE base) must continue exactly like one
    evaluated at the new positions."""
    model, ids, nxt = shift_case
    ref = _log_softmax(model.logits_for(ids + [nxt])[-1])
    model.kv.clear()
    model.decode(Batch(ids, pos=offset))
    model.kv.seq_add(0, -1, -1, delta)
    assert model.kv.seq_pos_min(0) == offset + delta
    got = _log_softmax(model.decode(Batch([nxt]))[0])
    assert np.abs(got - ref).max() <= 1e-2
    # without the K re-rope the continuation is visibly off
    model.kv.clear()
    model.decode(Batch(ids, pos=offset))
    model.kv.pos[model.kv.pos >= 0] += delta  # positions moved, K left as it was
    wrong = _log_softmax(model.decode(Batch([nxt]))[0])
    assert np.abs(wrong - ref).max() > 0.1


def test_context_shift_continues_sanely(shift_case):
    """llama.cpp's context shift: keep n_keep tokens, drop half of the rest, move the tail down.
    The tail's cached K/V were computed while the dropped tokens were there, so the continuation
    only approximates re-evaluating the kept tokens: same top token, small divergence."""
    model, ids, nxt = shift_case
    n_past, n_keep = len(ids), 4
    n_discard = (n_past - n_keep) // 2
    model.kv.clear()
    model.decode(Batch(ids, pos=0))
    model.kv.seq_rm(0, n_keep, n_keep + n_discard)
    model.kv.seq_add(0, n_keep + n_discard, n_past, -n_discard)
    assert model.kv.seq_pos_max(0) == n_past - n_discard - 1
    assert model.kv.used_cells == n_past - n_discard
    shifted = _log_softmax(model.decode(Batch([nxt]))[0])  # at position n_past - n_discard
    assert model.kv.seq_pos_max(0) == n_past - n_discard
    ref = _log_softmax(model.logits_for(ids[:n_keep] + ids[n_keep + n_discard:] + [nxt])[-1])
    assert shifted.argmax() == ref.argmax()
    kl = float((np.exp(ref) * (ref - shifted)).sum())
    print(f"\ncontext shift: KL(re-evaluation || shifted) = {kl:.3f}")
    assert kl < 1.0


@pytest.mark.usefixtures("float32_products")
def test_sliding_window_masks_incrementally_like_in_a_batch(gemma3_path, golden_gemma3):
    ids = golden_gemma3["greedy"][6]["prompt_ids"][:18]
    with GGUFFile.open(gemma3_path) as f:
        model = Model.load(f, LoadConfig(n_ctx=64, cache_type_k="f32", cache_type_v="f32"))
    full_window = model.logits_for(ids)
    model.hparams.n_swa = 6  # a tiny window, to see it work on local layers
    batch = model.logits_for(ids)
    assert _close(batch[:6], full_window[:6])  # within the window nothing changes
    assert not _close(batch[-1], full_window[-1], rel=1e-2)
    model.kv.clear()
    rows = [model.decode(Batch(ids[:10], pos=0))[0]]
    rows += [model.decode(Batch([t]))[0] for t in ids[10:]]
    assert _close(np.stack(rows), batch[9:])
