"""RoPE's parameters per layer (ggml_rope_ext's arguments), device-neutral: each backend rotates
with them (the CPU's `cpu.ops.rope_apply`, CUDA's `cuda.elementwise.rope`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Yarn:
    """YaRN's context extension (ggml's rope_yarn): ext_factor mixes the scaled angle back to the
    unscaled one on the pairs that turn more than beta_fast times (fully) to beta_slow times (not
    at all) over n_ctx_orig positions, the model's original context (llama.cpp's
    yarn_ext_factor, yarn_beta_fast, yarn_beta_slow and n_ctx_orig_yarn)."""
    n_ctx_orig: int
    ext_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self):
        if self.ext_factor and int(self.n_ctx_orig) <= 0:
            raise ValueError("rope: YaRN (ext_factor set) needs the original context length")


class RopeSpec:
    """How one layer rotates Q and K: the parameters of ggml_rope_ext.

    n_dims:       rotated dims per head (the rest are left as they are)
    freq_base:    theta base; pair i turns at base^(-2i/n_dims) per position
    freq_scale:   1/scaling factor (linear scaling; YaRN's interpolation)
    neox:         pairs `(i, i + n_dims/2)` instead of `(2i, 2i+1)`
    freq_factors: per-pair divisors of the angle (Llama 3.1's rope_freqs, LongRoPE's factors)
    yarn:         YaRN's parameters (a `Yarn`), or None without YaRN; kept as the attributes
                  n_ctx_orig, ext_factor, beta_fast, beta_slow (0, 0.0, 32.0, 1.0 without)
    attn_factor:  the magnitude cos and sin are multiplied by (llama_context's yarn_attn_factor,
                  times 1 + 0.1·ln(1/freq_scale) when ext_factor is set, as rope_yarn does)
    """

    __slots__ = ("n_dims", "freq_base", "freq_scale", "neox", "freq_factors", "n_ctx_orig",
                 "ext_factor", "attn_factor", "beta_fast", "beta_slow")

    def __init__(self, n_dims: int, freq_base: float, freq_scale: float = 1.0, neox: bool = False,
                 freq_factors: np.ndarray | None = None, *, yarn: Yarn | None = None,
                 attn_factor: float = 1.0):
        if n_dims <= 0 or n_dims % 2:
            raise ValueError(f"rope: n_dims must be a positive even number, got {n_dims}")
        self.n_dims = int(n_dims)
        self.freq_base = float(freq_base)
        self.freq_scale = float(freq_scale)
        self.neox = bool(neox)
        self.freq_factors = None if freq_factors is None else np.ascontiguousarray(
            freq_factors, dtype=np.float32)
        if self.freq_factors is not None and self.freq_factors.shape != (self.n_dims // 2,):
            raise ValueError(f"rope: {self.freq_factors.shape} frequency factors for "
                             f"{self.n_dims // 2} pairs")
        yarn = yarn or Yarn(0, ext_factor=0.0)
        self.n_ctx_orig = int(yarn.n_ctx_orig)
        self.ext_factor = float(yarn.ext_factor)
        self.beta_fast = float(yarn.beta_fast)
        self.beta_slow = float(yarn.beta_slow)
        self.attn_factor = float(attn_factor)

    def theta_scale(self) -> np.float32:
        """base^(-2/n_dims) in float32 (ggml's theta_scale)."""
        return np.float32(np.float32(self.freq_base) ** np.float32(-2.0 / self.n_dims))

    def yarn_corr_dims(self) -> tuple[np.float32, np.float32]:
        """ggml_rope_yarn_corr_dims: the pair range over which YaRN ramps from extrapolation to
        interpolation, (0, 0) without YaRN."""
        if not self.ext_factor:
            return np.float32(0.0), np.float32(0.0)
        f32 = np.float32
        two_log_base = f32(2.0) * np.log(f32(self.freq_base))

        def corr_dim(turns):  # the dim whose pair turns `turns` times over n_ctx_orig positions
            ratio = f32(self.n_ctx_orig) / (f32(turns) * f32(2.0) * f32(math.pi))
            return f32(self.n_dims) * np.log(ratio) / two_log_base

        lo = max(f32(0.0), np.floor(corr_dim(self.beta_fast)))
        hi = min(f32(self.n_dims - 1), np.ceil(corr_dim(self.beta_slow)))
        return f32(lo), f32(hi)

    def mscale(self) -> np.float32:
        """What cos and sin are multiplied by (rope_yarn's mscale)."""
        m = np.float32(self.attn_factor)
        if self.ext_factor:
            m = m * (np.float32(1.0) + np.float32(0.1) *
                     np.log(np.float32(1.0) / np.float32(self.freq_scale)))
        return np.float32(m)

    def key(self) -> tuple:
        ff = None if self.freq_factors is None else self.freq_factors.tobytes()
        return (self.n_dims, self.freq_base, self.freq_scale, self.neox, ff, self.n_ctx_orig,
                self.ext_factor, self.attn_factor, self.beta_fast, self.beta_slow)


    def __eq__(self, other):
        return isinstance(other, RopeSpec) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        kind = "neox" if self.neox else "norm"
        ff = "" if self.freq_factors is None else ", freq_factors"
        yarn = "" if not self.ext_factor else \
            f", yarn(orig={self.n_ctx_orig}, ext={self.ext_factor:g})"
        magnitude = "" if self.attn_factor == 1.0 else f", attn_factor={self.attn_factor:g}"
        return (f"RopeSpec({self.n_dims}, base={self.freq_base:g}, scale={self.freq_scale:g}, "
                f"{kind}{ff}{yarn}{magnitude})")
