"""KL divergence against a base model, in llama-perplexity's file format and with its statistics.

A user compares a quantization with its source (or one engine with another) in two runs:

    llamatui perplexity -m base.gguf -f text.txt -c 512 --kl-divergence-base base.kld
    llamatui perplexity -m quant.gguf --kl-divergence-base base.kld --kl-divergence

The file is llama-perplexity's (tools/perplexity/perplexity.cpp, `perplexity` with
`--kl-divergence-base` and `kl_divergence`), so either program reads what the other wrote:

    "_logits_"                      8 bytes
    n_ctx   uint32, n_vocab int32, n_chunk int32
    tokens  int32[n_chunk * n_ctx]  the text's tokens (BOS as tokenized, not substituted)
    per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them):
        scale float32, min_log_prob float32, then n_vocab uint16, padded to an even count

A position's log-probabilities are stored over [min_log_prob, min_log_prob + 65535 * scale]:
the range is at most 16 nats below the top logit and everything lower reads as its bottom, as
llama.cpp's `log_softmax` writes them (the uint16 is `nearest_int((logit - min_logit) / scale)`).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .perplexity import chunk_inputs, scored_positions

MAGIC = b"_logits_"
HEADER_BYTES = len(MAGIC) + 12
FLOOR_NATS = 16.0  # below the top logit, log-probabilities are stored as the range's bottom


class LogitsFileError(ValueError):
    """A file that is not a usable llama-perplexity log-probability file."""


def row_values(n_vocab: int) -> int:
    """uint16 values per stored position: two float32 headers and the vocabulary, even."""
    return 2 * ((n_vocab + 1) // 2) + 4


# ----------------------------------------------------------------------------- writing


def quantize_log_probs(logits: np.ndarray) -> np.ndarray:
    """(n, n_vocab) logits -> (n, row_values) uint16 rows as llama.cpp's `log_softmax` writes
    them: float32 arithmetic in its order, the sum of exponentials in float64."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n, n_vocab = logits.shape
    max_logit = logits.max(axis=1)
    min_logit = np.maximum(logits.min(axis=1), max_logit - np.float32(FLOOR_NATS))
    sum_exp = np.exp(logits - max_logit[:, None]).sum(axis=1, dtype=np.float64)
    log_sum_exp = np.log(sum_exp).astype(np.float32)
    min_log_prob = min_logit - max_logit - log_sum_exp
    scale = (max_logit - min_logit) / np.float32(65535)
    rows = np.zeros((n, row_values(n_vocab)), np.uint16)
    rows[:, :4] = np.stack([scale, min_log_prob], axis=1).astype(np.float32).view(np.uint16)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    # nearest_int: round half to even, as ggml's magic-number rounding does in this range
    q = np.rint(inv_scale[:, None] * (logits - min_logit[:, None]))
    rows[:, 4:4 + n_vocab] = np.where(logits > min_logit[:, None], q, 0).astype(np.uint16)
    return rows


class LogitsFileWriter:
    """Writes a base file as llama-perplexity's `--kl-divergence-base` does. The bytes go to
    `<path>.part`, renamed to `path` by `close()` once every chunk is in: a run that fails (a
    full disk, an interrupt) leaves no half file behind and keeps an earlier one."""

    def __init__(self, path: str | os.PathLike, n_ctx: int, n_vocab: int,
                 tokens: Sequence[int], n_chunks: int):
        self.path = os.fspath(path)
        self.part = self.path + ".part"
        self.n_vocab = n_vocab
        self.rows_per_chunk = scored_positions(n_ctx)
        self._f = open(self.part, "wb")
        try:
            self._f.write(MAGIC)
            self._f.write(np.array([n_ctx], np.uint32).tobytes())
            self._f.write(np.array([n_vocab, n_chunks], np.int32).tobytes())
            self._f.write(np.asarray(tokens[:n_chunks * n_ctx], np.int32).tobytes())
        except BaseException:
            self.abort()
            raise

    def write_chunk(self, scored_logits: np.ndarray) -> None:
        """The logits of one chunk's scored positions, (n_ctx - 1 - n_ctx/2, n_vocab)."""
        if scored_logits.shape != (self.rows_per_chunk, self.n_vocab):
            raise ValueError(f"a chunk has {self.rows_per_chunk} scored positions of "
                             f"{self.n_vocab} logits, got {scored_logits.shape}")
        self._f.write(quantize_log_probs(scored_logits).tobytes())

    def close(self) -> None:
        self._f.close()
        os.replace(self.part, self.path)

    def abort(self) -> None:
        self._f.close()
        if os.path.exists(self.part):
            os.remove(self.part)


# ----------------------------------------------------------------------------- reading


@dataclass
class LogitsFile:
    """A base file, checked and mapped: its header, tokens and stored log-probabilities."""
    path: str
    n_ctx: int
    n_vocab: int
    n_chunks: int
    tokens: np.ndarray  # int32 (n_chunks * n_ctx,)
    rows: np.ndarray  # uint16 (n_chunks, scored_positions(n_ctx), row_values(n_vocab))

    @classmethod
    def open(cls, path: str | os.PathLike) -> "LogitsFile":
        path = os.fspath(path)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
        if len(head) < len(MAGIC) or head[:len(MAGIC)] != MAGIC:
            raise LogitsFileError(f"{path} does not look like a file containing log-probabilities "
                                  "(llama-perplexity's --kl-divergence-base format)")
        if len(head) < HEADER_BYTES:
            raise LogitsFileError(f"{path}: truncated header ({size} bytes)")
        n_ctx = int(np.frombuffer(head, np.uint32, 1, 8)[0])
        n_vocab, n_chunks = (int(v) for v in np.frombuffer(head, np.int32, 2, 12))
        if n_ctx < 2 or n_vocab < 1 or n_chunks < 1:
            raise LogitsFileError(f"{path}: implausible header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                                  f"n_chunk {n_chunks})")
        n_rows = scored_positions(n_ctx)
        tokens_bytes = 4 * n_chunks * n_ctx
        want = HEADER_BYTES + tokens_bytes + 2 * n_chunks * n_rows * row_values(n_vocab)
        if size != want:
            raise LogitsFileError(f"{path}: {size} bytes, but n_ctx {n_ctx}, n_vocab {n_vocab} "
                                  f"and {n_chunks} chunks take {want} (truncated or not this "
                                  "format)")
        tokens = np.memmap(path, np.int32, "r", HEADER_BYTES, (n_chunks * n_ctx,))
        rows = np.memmap(path, np.uint16, "r", HEADER_BYTES + tokens_bytes,
                         (n_chunks, n_rows, row_values(n_vocab)))
        return cls(path, n_ctx, n_vocab, n_chunks, tokens, rows)

    def base_log_probs(self, chunk: int) -> np.ndarray:
        """float32 (scored positions, n_vocab): chunk's stored log-probabilities, decoded."""
        rows = np.asarray(self.rows[chunk])
        head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
        scale, min_log_prob = head[:, :1], head[:, 1:2]
        return scale * rows[:, 4:4 + self.n_vocab].astype(np.float32) + min_log_prob


# ----------------------------------------------------------------------------- statistics


@dataclass
class KLDivergence:
    """llama-perplexity's `kl_divergence_result` and the per-position values it sorts."""
    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, base: np.ndarray, targets: np.ndarray) -> None:
        """One chunk: our logits and the base's log-probabilities at its scored positions
        (both (n, n_vocab)), and the tokens that follow each position."""
        logits = np.asarray(logits, np.float32)
        rows = np.arange(len(targets))
        imax = logits.argmax(axis=1)
        max_logit = logits[rows, imax]
        sum_exp = np.exp(logits - max_logit[:, None]).sum(axis=1, dtype=np.float64)
        norm = max_logit + np.log(sum_exp).astype(np.float32)  # max_logit + log_sum_exp
        nll = (norm - logits[rows, targets]).astype(np.float64)
        nll_base = -base[rows, targets].astype(np.float64)
        kept = base > -FLOOR_NATS
        terms = np.where(kept, np.exp(base) * (base - logits + norm[:, None]), 0)
        kld = terms.sum(axis=1, dtype=np.float64)
        p_diff = (np.exp(-nll.astype(np.float32)) - np.exp(-nll_base.astype(np.float32)))
        p_diff = p_diff.astype(np.float64)
        self.sum_nll += nll.sum()
        self.sum_nll2 += (nll * nll).sum()
        self.sum_nll_base += nll_base.sum()
        self.sum_nll_base2 += (nll_base * nll_base).sum()
        self.sum_nll_nll_base += (nll * nll_base).sum()
        self.sum_kld += kld.sum()
        self.sum_kld2 += (kld * kld).sum()
        self.sum_p_diff += p_diff.sum()
        self.sum_p_diff2 += (p_diff ** 2).sum()
        self.sum_p_diff4 += (p_diff ** 4).sum()
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max()))
        self.n_same_top += int((imax == base.argmax(axis=1)).sum())
        self.count += len(targets)
        self.kld_values.append(kld.astype(np.float32))
        self.p_diff_values.append(p_diff.astype(np.float32))

    # the figures, as llama-perplexity computes them

    def mean_and_uncertainty(self, total: float, total2: float) -> tuple[float, float]:
        if self.count < 1:
            return 0.0, 0.0
        f = total / self.count
        df = total2 / self.count - f * f
        return f, (math.sqrt(df / (self.count - 1)) if df > 0 and self.count > 10 else 0.0)

    def log_ppl(self) -> tuple[float, float]:
        return self.mean_and_uncertainty(self.sum_nll, self.sum_nll2)

    def log_ppl_base(self) -> tuple[float, float]:
        return self.mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2)

    def log_ppl_covariance(self) -> float:
        if self.count < 10:
            return 0.0
        n = self.count
        return (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1)

    def log_ppl_ratio(self) -> tuple[float, float]:
        (a, da), (b, db) = self.log_ppl(), self.log_ppl_base()
        var = da * da + db * db - 2.0 * self.log_ppl_covariance()
        return a - b, math.sqrt(max(var, 0.0))

    def mean_kld(self) -> tuple[float, float]:
        return self.mean_and_uncertainty(self.sum_kld, self.sum_kld2)

    def rms_p_diff(self) -> tuple[float, float]:
        mse, dmse = self.mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4)
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * dmse if rms else 0.0)

    def same_top(self) -> tuple[float, float]:
        p = self.n_same_top / self.count if self.count else 0.0
        return p, (math.sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else 0.0)

    def sorted_values(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.sort(np.concatenate(self.kld_values)),
                np.sort(np.concatenate(self.p_diff_values)))


def kl_divergence(evaluate: Callable[[list[int]], np.ndarray], base: LogitsFile,
                  bos_id: int | None, n_vocab: int,
                  on_chunk: Callable[[int, int, KLDivergence], None] | None = None
                  ) -> KLDivergence:
    """llama-perplexity's `kl_divergence`: every chunk of the base file's tokens evaluated as a
    fresh sequence (`evaluate(ids)` -> logits (len(ids), n_vocab)), its scored positions compared
    with the stored log-probabilities. `on_chunk(i, n, running)` reports progress."""
    if n_vocab != base.n_vocab:
        raise LogitsFileError(f"{base.path}: inconsistent vocabulary ({base.n_vocab} in the file, "
                              f"{n_vocab} in the model): it was written for another model")
    n_ctx, first = base.n_ctx, base.n_ctx // 2
    result = KLDivergence()
    for c, chunk in enumerate(chunk_inputs(base.tokens, n_ctx, base.n_chunks, bos_id)):
        logits = evaluate(chunk)[first:n_ctx - 1]
        targets = np.asarray(base.tokens[c * n_ctx + first + 1:(c + 1) * n_ctx], np.int64)
        result.add(logits, base.base_log_probs(c), targets)
        if on_chunk:
            on_chunk(c + 1, base.n_chunks, result)
    return result


# ----------------------------------------------------------------------------- the report

CHUNK_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                "              Δp RMS            Same top p")


def chunk_line(i: int, r: KLDivergence) -> str:
    """llama-perplexity's running line after chunk i."""
    lp, dlp = r.log_ppl()
    ratio, dratio = r.log_ppl_ratio()
    kld, dkld = r.mean_kld()
    rms, drms = r.rms_p_diff()
    top, dtop = r.same_top()
    ppl = math.exp(lp)
    return (f"{i:4d}    {ppl:9.4f} ± {ppl * dlp:9.4f}    {ratio:10.5f} ± {dratio:10.5f}"
            f"    {kld:10.5f} ± {dkld:10.5f}    {100 * rms:6.3f} ± {100 * drms:6.3f} %"
            f"    {100 * top:6.3f} ± {100 * dtop:6.3f} %")


def _percentile(values: np.ndarray, fraction: float) -> float:
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = fraction * (len(values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def _median(values: np.ndarray) -> float:
    n = len(values)
    return float(0.5 * (values[n // 2] + values[n // 2 - 1]) if n % 2 == 0 else values[n // 2])


def report(r: KLDivergence) -> list[str]:
    """llama-perplexity's closing statistics (nothing under 100 scored positions, as there)."""
    if r.count < 100:
        return []
    kld_values, p_diff_values = r.sorted_values()
    (lp, dlp), (lb, dlb) = r.log_ppl(), r.log_ppl_base()
    ppl, ppl_base = math.exp(lp), math.exp(lb)
    cov = r.log_ppl_covariance()
    ratio, dratio = r.log_ppl_ratio()
    ppl_cov = ppl * ppl_base * cov
    diff_unc = math.sqrt(max((ppl * dlp) ** 2 + (ppl_base * dlb) ** 2 - 2.0 * ppl_cov, 0.0))
    cor = cov / (dlp * dlb) if dlp and dlb else 0.0
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl * dlp:10.6f}",
             f"Mean PPL(base)                : {ppl_base:10.6f} ± {ppl_base * dlb:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {dratio:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f} ± "
             f"{math.exp(ratio) * dratio:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f} ± {diff_unc:10.6f}",
             "", "====== KL divergence statistics ======"]
    kld, dkld = r.mean_kld()
    lines.append(f"Mean    KLD: {kld:10.6f} ± {dkld:10.6f}")
    lines.append(f"Maximum KLD: {kld_values[-1]:10.6f}")
    for label, frac in (("99.9%", .999), ("99.0%", .99), ("95.0%", .95), ("90.0%", .9)):
        lines.append(f"{label}   KLD: {_percentile(kld_values, frac):10.6f}")
    lines.append(f"Median  KLD: {_median(kld_values):10.6f}")
    for label, frac in ((" 10.0%", .1), ("  5.0%", .05), ("  1.0%", .01), ("  0.1%", .001)):
        lines.append(f"{label[1:]}   KLD: {_percentile(kld_values, frac):10.6f}")
    lines.append(f"Minimum KLD: {kld_values[0]:10.6f}")
    lines += ["", "====== Token probability statistics ======"]
    mean_dp, dmean_dp = r.mean_and_uncertainty(r.sum_p_diff, r.sum_p_diff2)
    lines.append(f"Mean    Δp: {100 * mean_dp:6.3f} ± {100 * dmean_dp:5.3f} %")
    lines.append(f"Maximum Δp: {100 * p_diff_values[-1]:6.3f}%")
    for label, frac in (("99.9%", .999), ("99.0%", .99), ("95.0%", .95), ("90.0%", .9),
                        ("75.0%", .75)):
        lines.append(f"{label}   Δp: {100 * _percentile(p_diff_values, frac):6.3f}%")
    lines.append(f"Median  Δp: {100 * _median(p_diff_values):6.3f}%")
    for label, frac in (("25.0%", .25), ("10.0%", .1), (" 5.0%", .05), (" 1.0%", .01),
                        (" 0.1%", .001)):
        lines.append(f"{label}   Δp: {100 * _percentile(p_diff_values, frac):6.3f}%")
    lines.append(f"Minimum Δp: {100 * p_diff_values[0]:6.3f}%")
    rms, drms = r.rms_p_diff()
    lines.append(f"RMS Δp    : {100 * rms:6.3f} ± {100 * drms:5.3f} %")
    top, dtop = r.same_top()
    lines.append(f"Same top p: {100 * top:6.3f} ± {100 * dtop:5.3f} %")
    return lines
