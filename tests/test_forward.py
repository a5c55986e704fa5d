"""The forward pass against llama.cpp's logits, and decoding through the KV cache."""
import math

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference.cpu import ops
from llamatui.inference.quants.fp16 import GELU_F16_TABLE
from llamatui.inference.gguf import GGUFFile, GGUFWriter
from llamatui.inference.kv_cache import KVCacheFullError
from llamatui.inference.catalog import UnsupportedArchitectureError
from llamatui.inference.model import Batch, Model
from llamatui.inference.rope import RopeSpec
from llamatui.inference.cpu import attention


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    m = row.max()
    return row - (m + math.log(np.exp(row - m).sum()))


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        yield Model.load(f, LoadConfig(n_ctx=256))


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    with GGUFFile.open(gemma3_path) as f:
        yield Model.load(f, LoadConfig(n_ctx=256))


@pytest.fixture(scope="module")
def smollm2_f32(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        yield Model.load(f, LoadConfig(n_ctx=128, cache_type_k="f32", cache_type_v="f32"))


@pytest.fixture(scope="module")
def gemma3_f32(gemma3_path):
    with GGUFFile.open(gemma3_path) as f:
        yield Model.load(f, LoadConfig(n_ctx=128, cache_type_k="f32", cache_type_v="f32"))


def _teacher_forced_figures(model, golden):
    """(top-1 agreement on confident steps, confident step count, mean |Δ logprob of llama.cpp's
    top-1|, step count) along llama.cpp's greedy runs."""
    agree = confident = 0
    diffs = []
    for run in golden["greedy"]:
        if run["steps"] is None:
            continue
        prompt, tokens = run["prompt_ids"], run["tokens"]
        # one batch, logits only for the rows that predict a generated token
        wanted = np.zeros(len(prompt) + len(tokens), bool)
        wanted[len(prompt) - 1:len(prompt) - 1 + len(run["steps"])] = True
        model.kv.clear()
        logits = model.decode(Batch(prompt + tokens, pos=0, logits=wanted))
        assert logits.shape == (len(run["steps"]), model.n_vocab)
        for i, step in enumerate(run["steps"]):
            lp = _log_softmax(logits[i])
            (top1, top1_lp), (_, top2_lp) = step["top"][0], step["top"][1]
            diffs.append(abs(lp[top1] - top1_lp))
            if top1_lp - top2_lp >= 0.25:
                confident += 1
                agree += int(np.argmax(lp) == top1)
    return agree / confident, confident, float(np.mean(diffs)), len(diffs)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_teacher_forced_matches_llama_cpp(which, request):
    model = request.getfixturevalue(which)
    golden = request.getfixturevalue(f"golden_{which}")
    agreement, confident, mean_diff, steps = _teacher_forced_figures(model, golden)
    print(f"\n{which}: top-1 agreement {agreement:.2%} over {confident} confident steps, "
          f"mean |Δ logprob| {mean_diff:.4f} nats over {steps} steps")
    assert confident > 100
    assert agreement >= 0.99
    assert mean_diff <= 0.05


# (precision, max |Δ logit| / max |logit|): float32 summation order apart; bfloat16 prompt
# products within their rounding; 8-bit activations in the token-by-token steps within theirs
PRECISIONS = {"float32": 2e-3, "bf16": 3e-2, "int8": 6e-2}


@pytest.mark.parametrize("which", ["smollm2_f32", "gemma3_f32"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_incremental_decoding_equals_one_batch(which, precision, request, monkeypatch):
    """Token by token after a prompt, as one batch: the same logits, to the precision's rounding
    (bfloat16 prompt products where the CPU has them; 8-bit decode kernels where it has VNNI)."""
    from llamatui.inference.cpu import matmul
    if precision == "bf16" and not matmul.HAS_AVX512_BF16:
        pytest.skip("this CPU has no AVX512-BF16")
    if precision == "int8" and not matmul.HAS_INT8_DOT:
        pytest.skip("this CPU has no AVX512-VNNI / AVX-VNNI")
    monkeypatch.setattr(matmul, "USE_BF16", precision == "bf16")
    monkeypatch.setattr(matmul, "USE_INT8", precision == "int8")
    model = request.getfixturevalue(which)
    run = request.getfixturevalue("golden_" + which.split("_")[0])["greedy"][6]  # 30+ tokens
    ids = run["prompt_ids"] + run["tokens"][:8]
    n_prompt = len(run["prompt_ids"])
    full = model.logits_for(ids)

    model.kv.clear()
    rows = [model.decode(Batch(ids[:n_prompt], pos=0))[0]]
    for t in ids[n_prompt:]:
        rows.append(model.decode(Batch([t]))[0])  # positions continue from the cache
    inc = np.stack(rows)
    ref = full[n_prompt - 1:]
    err = np.abs(inc - ref).max() / np.abs(ref).max()
    print(f"\n{which} ({precision}): incremental vs one batch, max |Δ logit| / max |logit| = "
          f"{err:.2e}")
    assert err <= PRECISIONS[precision]
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= (0.5 if precision == "int8" else 0)  # not a near-tie
    assert (inc.argmax(axis=1) == ref.argmax(axis=1))[clear].all()
    assert model.kv.seq_pos_max(0) == len(ids) - 1
    assert model.kv.used_cells == len(ids)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_cache_types_stay_close(which, request, float32_products):
    # float32 products: the cache's own rounding, not 8-bit activations amplifying it
    path = request.getfixturevalue(f"{which}_path")
    golden = request.getfixturevalue(f"golden_{which}")
    ids = golden["greedy"][3]["prompt_ids"] + golden["greedy"][3]["tokens"][:10]
    results = {}
    with GGUFFile.open(path) as f:
        for t in ("f32", "f16", "q8_0"):
            model = Model.load(f, LoadConfig(n_ctx=64, cache_type_k=t, cache_type_v=t))
            results[t] = np.stack([_log_softmax(r) for r in model.logits_for(ids)])
            if t == "q8_0":
                assert model.kv.nbytes < results["nbytes_f16"] * 0.6
            results["nbytes_" + t] = model.kv.nbytes
    ref = results["f32"]
    top = ref.argmax(axis=1)
    for t, tol in (("f16", 0.01), ("q8_0", 0.05)):
        lp = results[t]
        d = np.abs(lp[np.arange(len(ids)), top] - ref[np.arange(len(ids)), top])
        print(f"\n{which} {t} cache: mean |Δ logprob of top-1| {d.mean():.4f}, max {d.max():.4f}")
        assert d.mean() <= tol
        assert (lp.argmax(axis=1) == top).mean() >= 0.9


@pytest.mark.usefixtures("float32_products")
def test_batch_outputs_and_positions(smollm2_f32, golden_smollm2):
    model = smollm2_f32
    ids = golden_smollm2["greedy"][2]["prompt_ids"]
    full = model.logits_for(ids)
    model.kv.clear()
    flags = np.zeros(len(ids), bool)
    flags[[1, 4, len(ids) - 1]] = True
    out = model.decode(Batch(ids, pos=0, logits=flags))
    assert out.shape == (3, model.n_vocab)
    np.testing.assert_allclose(out, full[flags], atol=2e-3)
    model.kv.clear()
    assert model.decode(Batch(ids)).shape == (1, model.n_vocab)  # default: last row only


@pytest.mark.usefixtures("float32_products")
def test_ubatches_give_the_same_logits(smollm2_path, golden_smollm2):
    ids = golden_smollm2["greedy"][6]["prompt_ids"]
    with GGUFFile.open(smollm2_path) as f:
        whole = Model.load(f, LoadConfig(n_ctx=64, cache_type_k="f32", cache_type_v="f32"))
        split = Model.load(f, LoadConfig(n_ctx=64, cache_type_k="f32", cache_type_v="f32",
                                         n_ubatch=7))
        np.testing.assert_allclose(split.logits_for(ids), whole.logits_for(ids), atol=2e-3)


def test_full_cache_raises_and_leaves_it_unchanged(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        model = Model.load(f, LoadConfig(n_ctx=16))
        model.decode(Batch(list(range(10, 22))))
        assert model.kv.used_cells == 12
        with pytest.raises(KVCacheFullError):
            model.decode(Batch(list(range(30, 35))))
        assert model.kv.used_cells == 12
        assert model.kv.seq_pos_max(0) == 11
        assert model.decode(Batch([5, 6, 7, 8])).shape == (1, model.n_vocab)
        assert model.kv.used_cells == 16


def test_elementwise_kernels():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 64)) * 4).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), want, rtol=1e-5, atol=1e-6)
    u = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(ops.swiglu(x, u), x / (1 + np.exp(-x)) * u, rtol=1e-5, atol=1e-6)
    g = np.concatenate([x, [[-12.0] * 32 + [11.0] * 32]]).astype(np.float32)
    u4 = np.concatenate([u, np.ones((1, 64), np.float32)])
    exact = ops.gelu_tanh(g) * u4
    got = ops.geglu(g, u4)  # fp16 table: within fp16 rounding of the exact GELU
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(u4).max())
    assert (got[3, :32] == 0).all() and (got[3, 32:] == 11.0).all()


def test_elementwise_kernels_on_a_prompt_match_ggml():
    """Prompt-sized inputs take the parallel kernels (and the CPU's fp16 conversion where there
    is one): GEGLU is ggml's fp16-table lookup bit for bit, SwiGLU within float32 rounding, RMS
    norm equals row-at-a-time."""
    rng = np.random.default_rng(7)
    g = (rng.standard_normal((300, 512)) * 4).astype(np.float32)
    g[0, :6] = [-10.0, 10.0, 9.999, -9.999, 65504.0, 1e-8]
    u = rng.standard_normal((300, 512)).astype(np.float32)
    table = GELU_F16_TABLE
    looked_up = table[g.astype(np.float16).view(np.uint16)] * u  # numpy rounds to nearest even
    want = np.where(g <= -10, np.float32(0), np.where(g >= 10, g * u, looked_up))
    np.testing.assert_array_equal(ops.geglu(g, u), want)
    silu = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    np.testing.assert_allclose(ops.swiglu(g, u), silu, rtol=1e-6, atol=1e-30)
    w = rng.standard_normal(512).astype(np.float32)
    whole = ops.rms_norm(g, w, 1e-6)
    assert all(np.array_equal(whole[i:i + 1], ops.rms_norm(g[i:i + 1], w, 1e-6))
               for i in (0, 151, 299))


def test_exp_matches_float64_within_two_ulp():
    x = np.concatenate([np.linspace(-86.5, 0, 100_001), np.linspace(0, 88.72, 1001)]).astype(
        np.float32)
    got = ops.exp_values(x)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(got - want) / want).max() < 2.5e-7  # float32 ulp: 1.2e-7
    assert (ops.exp_values(np.float32([-np.inf, -88.0, -1e30])) == 0).all()
    assert (ops.exp_values(np.float32([88.73, 1e30, np.inf])) == np.inf).all()
    assert np.isnan(ops.exp_values(np.float32([np.nan]))).all()


@pytest.mark.parametrize("neox", [False, True])
def test_rope_rotates_the_right_pairs(neox):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 10)).astype(np.float32)
    pos = np.array([0, 5, 1000])
    spec = RopeSpec(8, 10000.0, 0.5, neox)  # 8 of 10 dims rotated, linear scaling 2
    got = ops.rope_apply(x.copy(), pos, spec)
    theta = 0.5 * pos[:, None] * 10000.0 ** (-np.arange(4) * 2 / 8)
    i0, i1 = (np.arange(4), np.arange(4) + 4) if neox else (np.arange(0, 8, 2), np.arange(1, 8, 2))
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    want = x.astype(np.float64).copy()
    want[..., i0] = x[..., i0] * c - x[..., i1] * s
    want[..., i1] = x[..., i0] * s + x[..., i1] * c
    np.testing.assert_allclose(got, want, atol=5e-5)
    np.testing.assert_array_equal(got[0], x[0])  # position 0: no rotation
    np.testing.assert_array_equal(got[..., 8:], x[..., 8:])


@pytest.mark.parametrize("n,d,n_kv", [(1, 16, 30), (3, 16, 30), (2, 64, 700), (3, 80, 30),
                                       (3, 24, 30), (20, 16, 30), (150, 32, 157), (20, 24, 30)])
@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_attention_kernels_against_float64(n, d, n_kv, f16, softcap):
    """The decode kernel (few tokens; a long cache in pieces whose softmaxes are merged, pieces
    wholly outside the window included), its fallback for odd head sizes, the GEMM path (many
    tokens, chunks of query rows over the cells each can see) and the numpy path (odd head
    sizes) against a float64 reference, with grouped KV heads, a causal + sliding-window mask,
    fp16-bit K/V, and Gemma 2's soft-capped scores."""
    rng = np.random.default_rng(n)
    n_head, n_head_kv = 6, 2
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    cell_pos = np.arange(n_kv, dtype=np.int32)
    cell_pos[5] = -1  # an empty cell
    tok_pos = np.arange(n_kv - n, n_kv)
    mask = attention.build_kq_mask(cell_pos, np.ones((n_kv, 1), bool), tok_pos,
                             np.zeros(n, np.int64), n_kv, n_swa=12 if n_kv < 100 else 400)
    if f16:
        k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
        got = attention.attention(q, ops.f32_to_f16_bits(k), ops.f32_to_f16_bits(v), mask, 0.3,
                            softcap)
    else:
        got = attention.attention(q, k, v, mask, 0.3, softcap)
    want = np.empty((n, n_head, d))
    for h in range(n_head):
        g = h // (n_head // n_head_kv)
        s = q[:, h].astype(np.float64) @ k[:, g].astype(np.float64).T
        if softcap:
            s = np.tanh(s / softcap) * softcap
        s = s * 0.3 + mask
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, g]
    np.testing.assert_allclose(got, want.reshape(n, -1), atol=2e-6)



@pytest.mark.parametrize("n", [2, 8, 16])
def test_attention_of_tokens_from_different_sequences(n):
    """A decode step of n sequences, as the scheduler batches it: the sequences' cells lie
    interleaved in the cache (each step stores its n tokens side by side), and each token must
    see its own sequence's cells alone."""
    rng = np.random.default_rng(n)
    n_head, n_head_kv, d, steps = 4, 2, 32, 40
    n_kv = n * steps
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    cell_seq = np.zeros((n_kv, n), bool)
    cell_seq[np.arange(n_kv), np.arange(n_kv) % n] = True  # cell j: sequence j % n
    cell_pos = (np.arange(n_kv) // n).astype(np.int32)
    seqs = rng.permutation(n)
    mask = attention.build_kq_mask(cell_pos, cell_seq, np.full(n, steps - 1), seqs, n_kv)
    got = attention.attention(q, ops.f32_to_f16_bits(k), ops.f32_to_f16_bits(v), mask, 0.3)
    k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
    want = np.empty((n, n_head, d))
    for t, seq in enumerate(seqs):
        own = np.flatnonzero(cell_seq[:, seq])
        for h in range(n_head):
            g = h // (n_head // n_head_kv)
            s = k[own, g] @ q[t, h].astype(np.float64) * 0.3
            p = np.exp(s - s.max())
            want[t, h] = p / p.sum() @ v[own, g]
    np.testing.assert_allclose(got, want.reshape(n, -1), atol=2e-6)

def test_hyperparameters(smollm2, gemma3):
    hp = smollm2.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim_k) == (30, 576, 9, 3, 64)
    assert hp.rope_freq_base == 100000.0 and not hp.rope_neox and hp.n_swa == 0
    assert hp.kq_scale == pytest.approx(1 / 8)
    hp = gemma3.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim_k) == (18, 640, 4, 1, 256)
    assert hp.rope_neox and hp.n_swa == 512 and hp.rope_freq_base == 1e6
    assert [il for il in range(hp.n_layer) if not hp.is_swa(il)] == [5, 11, 17]
    assert hp.layer_rope(0).freq_base == 10000.0 and hp.layer_rope(5).freq_base == 1e6
    assert hp.attn_scale == pytest.approx(1 / 16)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = GGUFWriter(path)
    w.add("general.architecture", "mamba")
    w.add_tensor("token_embd.weight", "F32", (4, 8), np.zeros((4, 8), np.float32))
    w.write()
    with GGUFFile.open(path) as f:
        with pytest.raises(UnsupportedArchitectureError, match="unsupported model architecture "
                           "'mamba'; supported: .*gemma3, .*llama") as e:
            Model.load(f, LoadConfig(n_ctx=8))
    assert isinstance(e.value, ValueError)
