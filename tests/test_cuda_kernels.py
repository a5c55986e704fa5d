"""The CUDA kernels against the CPU backend.

CI has no GPU: numba's CUDA simulator runs every kernel on the CPU (each GPU thread a Python
thread) in a child process started with NUMBA_ENABLE_CUDASIM=1, since numba picks the simulator
when numba.cuda is first imported. The checks themselves are in tests/cuda_checks.py; each is
reported here as its own test. On a machine with a usable GPU, the `gpu` test runs the same
checks on the device. The simulator's child process also runs the CUDA backend's checks
(tests/test_cuda_backend.py reports those): one process per test session.
"""
import numpy as np
import pytest

import cuda_backend_checks
import cuda_checks
from llamatui.inference.rope import RopeSpec


@pytest.mark.parametrize("name", cuda_checks.CHECK_NAMES)
def test_kernel_under_the_simulator(name):
    cuda_checks.assert_passed(*cuda_checks.simulated_results(), name)


@pytest.mark.gpu
def test_kernels_on_the_gpu():
    from llamatui.inference.cuda import probe
    found = probe()
    if not found.available:
        pytest.skip(found.reason)
    proc, results = cuda_checks.run_checks({"NUMBA_ENABLE_CUDASIM": "0"},
                                           cuda_checks.CHECK_NAMES)
    for name in cuda_checks.CHECK_NAMES:
        cuda_checks.assert_passed(proc, results, name)


# ----------------------------------------------------------------------------- launcher checks
# Bad arguments are refused before any launch, with the value found and the one expected.


def test_unsupported_weight_type_is_named():
    from llamatui.inference.cuda.dequant import UnsupportedDeviceTypeError, dequantize_rows
    with pytest.raises(UnsupportedDeviceTypeError, match="'NVFP4'.*supported: F32"):
        dequantize_rows("NVFP4", np.zeros((2, 36), np.uint8), np.zeros(1, np.int64),
                        np.zeros((1, 256), np.float32))


def test_weight_of_the_wrong_row_size_is_refused():
    from llamatui.inference.cuda.matvec import matvec
    with pytest.raises(ValueError, match=r"uint8 \(rows, 36\).*got uint8 \(4, 34\)"):
        matvec("Q4_0", np.zeros((4, 34), np.uint8), np.zeros((1, 64), np.float32),
               np.zeros((1, 4), np.float32))


def test_matvec_refuses_a_prompt_sized_batch():
    from llamatui.inference.cuda.matvec import MAX_TOKENS, matvec
    n = MAX_TOKENS + 1
    with pytest.raises(ValueError, match=f"{n} tokens"):
        matvec("Q8_0", np.zeros((4, 34), np.uint8), np.zeros((n, 32), np.float32),
               np.zeros((n, 4), np.float32))


def _one_token_mask():
    from llamatui.inference.cuda.attention import CellMask
    return CellMask(np.zeros(4, np.int32), np.ones((4, 1), bool), np.zeros(1, np.int64),
                    np.zeros(1, np.int64))


def test_attention_refuses_heads_that_do_not_group():
    from llamatui.inference.cuda.attention import DeviceKV, attention
    q = np.zeros((1, 3, 32), np.float32)
    kv = DeviceKV(np.zeros((4, 128), np.uint8), "f16", 2, 32)
    with pytest.raises(ValueError, match="3 query heads over 2 KV heads"):
        attention(q, kv, kv, _one_token_mask(), 0.1, np.zeros((1, 3, 32), np.float32))


def test_attention_refuses_an_unknown_cache_type():
    from llamatui.inference.cuda.attention import DeviceKV, attention
    q = np.zeros((1, 2, 32), np.float32)
    kv = np.zeros((4, 128), np.uint8)
    with pytest.raises(ValueError, match="q4_0"):
        attention(q, DeviceKV(kv, "q4_0", 2, 32), DeviceKV(kv, "f16", 2, 32), _one_token_mask(),
                  0.1, np.zeros((1, 2, 32), np.float32))


def test_rope_refuses_tables_of_the_wrong_size():
    from llamatui.inference.cuda.elementwise import rope
    with pytest.raises(ValueError, match=r"\(3,\) frequency factors"):
        rope(np.zeros((2, 1, 8), np.float32), np.zeros(2, np.int64), RopeSpec(8, 1e4),
             np.ones(3, np.float32))


@pytest.mark.parametrize("assert_close", [cuda_checks.assert_close_f32,
                                          cuda_backend_checks.assert_close])
def test_a_failed_check_with_one_magnitude_says_where(assert_close):
    """One magnitude for every value (as the RoPE checks pass |x|.max()): the failure names the
    worst value and its bound, rather than failing on its own message (IndexError on a scalar
    bound, as on the H200)."""
    got = np.zeros((2, 3), np.float32)
    want = got.astype(np.float64)
    want[1, 2] = 0.5
    with pytest.raises(AssertionError, match=r"rope: error 0\.5 at \(1, 2\) beyond float32 "
                                             r"rounding \(1\.91e-06\)"):
        assert_close(got, want, np.float32(2.0), "rope", ulps=8)
