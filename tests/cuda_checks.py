"""The CUDA kernels checked against the CPU backend: run as a script, on a GPU or under numba's
CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, as tests/test_cuda_kernels.py runs it in CI). The
checks of the CUDA backend and of offloaded models (tests/cuda_backend_checks.py) run in the
same process; `simulated_results()` runs them all once per test session.

numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported, so the checks run in a
process of their own; this module imports nothing of numba at import time, so that the pytest
process can read CHECK_NAMES without choosing a CUDA mode. Each check prints one line,
MARK + {"check", "ok", "error"}. Shapes are small: the simulator runs every GPU thread as a
Python thread.

    NUMBA_ENABLE_CUDASIM=1 python tests/cuda_checks.py [check names...]
"""
import json
import os
import sys
import traceback
import warnings

import numpy as np

from cuda_backend_checks import BACKEND_CHECKS  # the backend's checks (no numba imported)
from golden_vectors import load_quant_vectors, rows_of
from llamatui.inference.rope import RopeSpec, Yarn

MARK = "CUDA-CHECK "
# every weight type the engine runs (llamatui.inference.cpu.matmul.supported_matmul_types())
WEIGHT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
                "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
                "MXFP4")
N_VALUES = 512  # values per weight row: two K-quant super-blocks

CHECKS = {}
# the inputs' seed: 0 in CI (reproducible); the GPU check (benchmarks/gpu_check.sh) draws a fresh
# one and records it, so that a failure there can be replayed
SEED = int(os.environ.get("LLAMATUI_CHECK_SEED", "0"))


def check_rng(n: int) -> np.random.Generator:
    """The random inputs of check number n under SEED."""
    return np.random.default_rng([n, SEED])


def check(name):
    def register(fn):
        CHECKS[name] = fn
        return fn
    return register


# ----------------------------------------------------------------------------- helpers


def to_device(a):
    from numba import cuda
    return cuda.to_device(np.ascontiguousarray(a))


def zeros_on_device(shape, dtype):
    return to_device(np.zeros(shape, dtype))


def assert_bits_equal(got, want, what):
    """Equal bit for bit, NaNs compared by position (a GPU's NaN results carry no payload)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaNs at other places"
    uint = np.uint32 if want.dtype == np.float32 else np.uint16
    differ = np.flatnonzero(got[~nan].view(uint) != want[~nan].view(uint))
    assert differ.size == 0, (f"{what}: {differ.size} values differ, first at {differ[0]}: "
                              f"{got[~nan][differ[0]]!r} != {want[~nan][differ[0]]!r}")


def assert_close_f32(got, want64, magnitude, what, ulps=64):
    """|got - want| within `ulps` float32 epsilons of `magnitude` (the sum of absolute terms
    that made each value): equal up to float32 rounding."""
    err = np.abs(got.astype(np.float64) - want64)
    # per value, also where one magnitude bounds them all (a scalar has no [worst] to report)
    bound = np.broadcast_to(ulps * np.finfo(np.float32).eps
                            * np.maximum(magnitude, np.finfo(np.float32).tiny), err.shape)
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(err / bound), err.shape))
    assert np.all(err <= bound), (f"{what}: error {err[worst]:.3g} at {worst} beyond float32 "
                                  f"rounding ({bound[worst]:.3g}); got {got[worst]}, "
                                  f"want {want64[worst]}")


def weight_rows(type_name, n_rows, rng):
    """n_rows of N_VALUES: llama.cpp's quantized rows from golden/quant_vectors.npz, plus (for
    quantized types) two rows of random bytes, whose fp16 scales hit subnormals, infinities and
    NaNs."""
    from llamatui.inference.cuda.dequant import device_type
    row_bytes = device_type(type_name).row_bytes(N_VALUES)
    vectors = load_quant_vectors()
    if type_name == "F32":
        return np.ascontiguousarray(vectors["x"][:n_rows, :N_VALUES]).view(np.uint8)
    rows = np.ascontiguousarray(rows_of(vectors, type_name)[:n_rows, :row_bytes])
    if type_name in ("F16", "BF16"):
        return rows
    noise = rng.integers(0, 256, (2, row_bytes), dtype=np.uint8)
    return np.concatenate([rows, noise])


def cpu_dequantize(type_name, rows):
    from llamatui.inference.quants import dequantize_rows
    return dequantize_rows(type_name, rows, N_VALUES)


# ----------------------------------------------------------------------------- checks


@check("registry")
def check_registry():
    from llamatui.inference.cuda.dequant import DEVICE_TYPES
    from llamatui.inference.cpu.matmul import supported_matmul_types
    assert set(DEVICE_TYPES) == set(WEIGHT_TYPES) == set(supported_matmul_types())


def check_dequantize(type_name):
    """Rows picked by id, dequantized to float32 and to float16: bit for bit the CPU's."""
    from llamatui.inference.cuda.dequant import dequantize_rows
    rng = check_rng(1)
    rows = weight_rows(type_name, 4, rng)
    ids = np.array([len(rows) - 1, 0, 2, len(rows) - 2, 2], np.int64)
    want = cpu_dequantize(type_name, rows[ids])
    w = to_device(rows)
    for dtype in (np.float32, np.float16):
        out = zeros_on_device((len(ids), N_VALUES), dtype)
        dequantize_rows(type_name, w, to_device(ids), out)
        with np.errstate(over="ignore", invalid="ignore"):
            expected = want.astype(dtype)
        assert_bits_equal(out.copy_to_host(), expected, f"{type_name} -> {np.dtype(dtype).name}")


def check_matvec(type_name):
    """The fused dequantize-dot for 1 and 3 tokens: the float64 product with the CPU's
    dequantized rows, up to float32 rounding."""
    from llamatui.inference.cuda.matvec import matvec
    rng = check_rng(2)
    rows = weight_rows(type_name, 5, rng)[:5]  # llama.cpp's rows only: finite products
    wf = cpu_dequantize(type_name, rows).astype(np.float64)
    w = to_device(rows)
    for n_tok in (1, 3):
        x = rng.standard_normal((n_tok, N_VALUES)).astype(np.float32)
        out = zeros_on_device((n_tok, len(rows)), np.float32)
        matvec(type_name, w, to_device(x), out)
        assert_close_f32(out.copy_to_host(), x.astype(np.float64) @ wf.T, np.abs(x) @ np.abs(wf).T,
                         f"{type_name} matvec, {n_tok} token(s)")


for _name in WEIGHT_TYPES:
    check(f"dequantize_{_name}")(lambda _n=_name: check_dequantize(_n))
    check(f"matvec_{_name}")(lambda _n=_name: check_matvec(_n))


@check("rms_norm")
def check_rms_norm():
    from llamatui.inference.cpu import ops
    from llamatui.inference.cuda.elementwise import rms_norm
    rng = check_rng(3)
    x = (rng.standard_normal((3, 200)) * 4).astype(np.float32)
    w = rng.standard_normal(200).astype(np.float32)
    out = zeros_on_device(x.shape, np.float32)
    rms_norm(to_device(x), to_device(w), 1e-6, out)
    want = ops.rms_norm(x, w, 1e-6).astype(np.float64)
    assert_close_f32(out.copy_to_host(), want, np.abs(want), "rms_norm", ulps=8)


@check("rope")
def check_rope():
    """NORM and NEOX, with and without frequency factors, YaRN, partial rotation
    (n_dims < head_dim), far positions: the CPU's angles (built the same way), cos/sin to float32
    rounding."""
    from llamatui.inference.cpu import ops
    from llamatui.inference.cuda.elementwise import rope
    rng = check_rng(4)
    pos = np.array([0, 7, 30000], np.int64)
    yarn = dict(yarn=Yarn(n_ctx_orig=64, ext_factor=1.0), attn_factor=0.9)
    for neox in (False, True):
        for factors, extra in ((None, {}), ((rng.random(16) + 0.5).astype(np.float32), {}),
                               (None, yarn)):
            spec = RopeSpec(32, 10000.0, 0.5, neox, factors, **extra)
            x = rng.standard_normal((3, 2, 40)).astype(np.float32)
            want = ops.rope_apply(x.copy(), pos, spec).astype(np.float64)
            got = to_device(x)
            ff = factors if factors is not None else np.ones(16, np.float32)
            rope(got, to_device(pos), spec, to_device(ff))
            assert_close_f32(got.copy_to_host(), want, np.abs(x).max(), f"rope neox={neox} "
                             f"factors={factors is not None} yarn={bool(extra)}", ulps=8)


@check("swiglu")
def check_swiglu():
    from llamatui.inference.cpu import ops
    from llamatui.inference.cuda.elementwise import swiglu
    rng = check_rng(5)
    g = (rng.standard_normal((3, 100)) * 6).astype(np.float32)
    u = rng.standard_normal((3, 100)).astype(np.float32)
    out = zeros_on_device(g.shape, np.float32)
    swiglu(to_device(g), to_device(u), out)
    want = ops.swiglu(g, u).astype(np.float64)
    assert_close_f32(out.copy_to_host(), want, np.abs(want), "swiglu", ulps=8)


@check("geglu")
def check_geglu():
    """Bit for bit ops.geglu: the fp16 rounding that indexes the table, ties to even included,
    the ±10 limits, fp16 subnormals."""
    from llamatui.inference.cpu import ops
    from llamatui.inference.cuda.elementwise import GELU_TABLE, geglu
    rng = check_rng(6)
    g = (rng.standard_normal((3, 128)) * 5).astype(np.float32)
    halves = np.array([1.0, 1.5, -2.25, 6e-5, -3e-7], np.float16)
    next_halves = np.nextafter(halves, np.float16(np.inf), dtype=np.float16)
    midpoints = (halves.astype(np.float64) + next_halves.astype(np.float64)) / 2
    g[0, :16] = np.concatenate([[10, -10, 9.999, -9.999, 0, -0.0, 1e-9, 2.0 ** -25, 2.0 ** -24],
                                midpoints, [65519.0 / 7000, -1e-30]]).astype(np.float32)
    u = rng.standard_normal((3, 128)).astype(np.float32)
    out = zeros_on_device(g.shape, np.float32)
    geglu(to_device(g), to_device(u), out, to_device(GELU_TABLE))
    assert_bits_equal(out.copy_to_host(), ops.geglu(g, u), "geglu")


def host_greedy(logits):
    """What the host does with each row of raw logits at a greedy step: its sampler's token
    (Sampler._sample_greedy: numpy's argmax, the lowest id on ties), or -1 where the scheduler
    refuses the row (Scheduler._sample's all_finite check: a NaN or an infinity)."""
    from llamatui.inference.sampling import Sampler, SamplingParams, all_finite
    greedy = Sampler(SamplingParams(temperature=0.0), logits.shape[1])
    return np.array([greedy.sample(row) if all_finite(row) else -1 for row in logits], np.int32)


@check("greedy_tokens")
def check_greedy_tokens():
    """The device's greedy token of each row is the host's: random rows, maxima tied across
    threads and warps (the lowest id wins), -0.0 against 0.0, all-negative rows, the maximum
    last; -1 for rows with a NaN, +inf or -inf (refused on the host too), wherever they are."""
    from llamatui.inference.cuda.sampling import GREEDY_THREADS, greedy_tokens
    rng = check_rng(8)
    n = 3 * GREEDY_THREADS + 7  # threads scan several strides, the last one partial
    x = rng.standard_normal((14, n)).astype(np.float32)
    x[1, [900 % n, 10, 500 % n]] = 50.0  # tied: the lowest id
    x[2] = 1.0  # all tied: token 0
    x[3, [GREEDY_THREADS + 3, 3]] = 9.0  # one thread's two strides
    x[4, [n - 1, 33]] = 9.0  # two warps' winners
    x[5] = -np.abs(x[5]) - 1.0  # all negative
    x[6, -1] = 60.0  # the maximum last
    x[7, :2] = (-0.0, 0.0)
    x[7, 2:] = -1.0  # -0.0 == 0.0: token 0
    x[8, 17] = np.nan
    x[9, -1] = np.nan
    x[10, 5] = np.inf
    x[11, 40] = -np.inf  # with a finite maximum: still refused, as the host refuses it
    x[12] = -np.inf
    x[13] = np.nan
    want = host_greedy(x)
    assert (want[3], want[4], want[7]) == (3, 33, 0)
    assert list(want[8:]) == [-1] * 6
    out = zeros_on_device(len(x), np.int32)
    greedy_tokens(to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), want)
    one = zeros_on_device(1, np.int32)  # a vocabulary smaller than a warp
    greedy_tokens(to_device(x[6:7, -5:]), one)
    assert one.copy_to_host()[0] == 4


def _attention_case(k_type, v_type, n_head, n_head_kv, d, n_swa, rng, sinks=None):
    from llamatui.inference.cpu import attention as cpu_attention
    from llamatui.inference.cuda.attention import CellMask, DeviceKV, attention
    from llamatui.inference.kv_cache import KVCache, KVRows
    n_cells = 70
    cache = KVCache(n_cells, 1, KVRows(n_head_kv, d, type_k=k_type, type_v=v_type), n_seq_max=2)
    cells = np.arange(n_cells)
    cache.k[0].write(cells, rng.standard_normal((n_cells, n_head_kv, d)).astype(np.float32))
    cache.v[0].write(cells, rng.standard_normal((n_cells, n_head_kv, d)).astype(np.float32))
    # two sequences interleaved in the cells, and empty cells at the end
    cell_pos = np.full(n_cells, -1, np.int32)
    cell_seq = np.zeros((n_cells, 2), bool)
    cell_pos[:40] = np.arange(40)
    cell_seq[:40, 0] = True
    cell_pos[40:64] = np.arange(24)
    cell_seq[40:64, 1] = True
    tok_pos = np.array([39, 23, 10], np.int64)
    tok_seq = np.array([0, 1, 0], np.int64)
    q = rng.standard_normal((3, n_head, d)).astype(np.float32)
    mask = cpu_attention.build_kq_mask(cell_pos, cell_seq, tok_pos, tok_seq, n_cells, n_swa)
    k32, v32 = cache.k[0].read_f32(n_cells), cache.v[0].read_f32(n_cells)
    want = cpu_attention.attention(q, k32, v32, mask, 0.17, sinks=sinks).reshape(
        3, n_head, d).astype(np.float64)
    out = zeros_on_device((3, n_head, d), np.float32)
    k = DeviceKV(to_device(cache.k[0].data.view(np.uint8)), k_type, n_head_kv, d)
    v = DeviceKV(to_device(cache.v[0].data.view(np.uint8)), v_type, n_head_kv, d)
    cells = CellMask(to_device(cell_pos), to_device(cell_seq), to_device(tok_pos),
                     to_device(tok_seq), n_swa)
    attention(to_device(q), k, v, cells, 0.17, out,
              sinks=None if sinks is None else to_device(sinks))
    magnitude = np.abs(v32).reshape(n_cells, -1).max()
    assert_close_f32(out.copy_to_host(), want, magnitude, f"attention K {k_type} V {v_type} "
                     f"heads {n_head}/{n_head_kv} n_swa {n_swa} sinks {sinks}", ulps=16)


@check("attention_f16")
def check_attention_f16():
    rng = check_rng(8)
    _attention_case("f16", "f16", 2, 1, 32, 0, rng)
    _attention_case("f16", "f16", 2, 2, 32, 8, rng)  # sliding window


@check("attention_q8_0")
def check_attention_q8_0():
    rng = check_rng(9)
    _attention_case("q8_0", "q8_0", 4, 2, 32, 0, rng)  # grouped-query heads


@check("attention_f32_mixed")
def check_attention_f32_mixed():
    rng = check_rng(10)
    _attention_case("f32", "q8_0", 2, 1, 64, 5, rng)


@check("attention_sinks")
def check_attention_sinks():
    """gpt-oss's sinks (one logit per head, joining the softmax) as the CPU kernel has them,
    one large enough to outweigh the cells; with a window, as gpt-oss's even layers."""
    rng = check_rng(11)
    sinks = np.array([6.0, -1.0, 0.5, 2.0], np.float32)
    _attention_case("f16", "f16", 4, 2, 32, 0, rng, sinks)
    _attention_case("q8_0", "f16", 4, 2, 32, 8, rng, sinks)


@check("swiglu_oai")
def check_swiglu_oai():
    """cpu.ops.swiglu_oai: the clamps at ±7 (gate from above only) and the sigmoid of 1.702 x."""
    from llamatui.inference.cpu import ops
    from llamatui.inference.cuda.elementwise import swiglu_oai
    rng = check_rng(12)
    g = (rng.standard_normal((3, 100)) * 6).astype(np.float32)
    u = (rng.standard_normal((3, 100)) * 6).astype(np.float32)
    g[0, :4] = u[0, :4] = [7.5, -7.5, 7.0, -100.0]
    out = zeros_on_device(g.shape, np.float32)
    swiglu_oai(to_device(g), to_device(u), 1.702, 7.0, out)
    want = ops.swiglu_oai(g, u, 1.702, 7.0).astype(np.float64)
    assert_close_f32(out.copy_to_host(), want, np.abs(want), "swiglu_oai", ulps=8)


CHECK_NAMES = tuple(CHECKS)
# the CUDA backend and the offloaded model (tests/cuda_backend_checks.py), run in the same process
CHECKS.update(BACKEND_CHECKS)
ALL_CHECK_NAMES = tuple(CHECKS)


def run_checks(extra_env: dict[str, str], names=(), timeout: float = 1800):
    """Runs checks (all when `names` is empty) in a child process with `extra_env`; returns the
    process and {name: record}."""
    import subprocess
    env = dict(os.environ, **extra_env)
    proc = subprocess.run([sys.executable, __file__, *names], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            record = json.loads(line[len(MARK):])
            results[record["check"]] = record
    return proc, results


_simulated = None


def assert_passed(proc, results, name):
    """A test's verdict on check `name` from run_checks' (process, records)."""
    record = results.get(name)
    assert record is not None, (f"check {name} did not report (exit {proc.returncode}):\n"
                                f"{proc.stderr[-4000:]}")
    assert record["ok"], record["error"]


def simulated_results():
    """Every check under the simulator, run once per pytest session (the kernel and the backend
    tests share the one child process)."""
    global _simulated
    if _simulated is None:
        _simulated = run_checks({"NUMBA_ENABLE_CUDASIM": "1"})
    return _simulated


def main(names):
    from numba.core import config
    if config.ENABLE_CUDASIM:
        # the simulator spins in Python while threads wait at barriers: switch threads often
        sys.setswitchinterval(2e-4)
        # it computes with numpy scalars, which warn where a GPU silently makes inf and NaN
        warnings.simplefilter("ignore", RuntimeWarning)
    for name in names or ALL_CHECK_NAMES:
        try:
            CHECKS[name]()
            record = {"check": name, "ok": True, "error": ""}
        except Exception:  # noqa: BLE001 -- reported to the pytest process, which fails on it
            record = {"check": name, "ok": False, "error": traceback.format_exc(limit=6)}
        print(MARK + json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
