"""The CUDA backend and GPU offload against the CPU backend (checks in tests/cuda_backend_checks.py).

CI has no GPU: the checks run under numba's CUDA simulator in the child process that also runs
the kernel checks (cuda_checks.simulated_results), with simulated devices whose sizes the checks
choose. On a machine with a usable GPU the `gpu` test runs them on the device, but for those
that need simulated devices (two of them, or a chosen memory size).
"""
import pytest

import cuda_backend_checks
import cuda_checks


@pytest.mark.parametrize("name", cuda_backend_checks.BACKEND_CHECK_NAMES)
def test_backend_under_the_simulator(name):
    cuda_checks.assert_passed(*cuda_checks.simulated_results(), name)


@pytest.mark.gpu
def test_backend_on_the_gpu():
    from llamatui.inference.cuda import probe
    found = probe()
    if not found.available:
        pytest.skip(found.reason)
    names = [n for n in cuda_backend_checks.BACKEND_CHECK_NAMES
             if n not in cuda_backend_checks.SIMULATOR_ONLY]
    proc, results = cuda_checks.run_checks({"NUMBA_ENABLE_CUDASIM": "0"}, names)
    for name in names:
        cuda_checks.assert_passed(proc, results, name)
