"""KL-divergence files as llama-perplexity writes and reads them (`--kl-divergence-base`,
`--kl-divergence`), and its statistics.

golden/llama_cpp_smollm2_c16.kld.gz: llama-perplexity (build 11434, CPU, 2 threads) on the
SmolLM2 starter, `-f texts/apache-2.0.txt -c 16 --chunks 1 --kl-divergence-base FILE`.
"""
import gzip
import math

import numpy as np
import pytest

from llamatui.app.cli import main
from llamatui.inference.kl_divergence import (LogitsFile, LogitsFileError, LogitsFileWriter,
                                              kl_divergence, quantize_log_probs, report,
                                              row_values)
from llamatui.inference.perplexity import log_softmax, perplexity

N_VOCAB, N_CTX = 37, 16


def random_logits(seed, n=N_CTX, scale=3.0):
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal((n, N_VOCAB))).astype(np.float32)


def model_of(seed, scale=3.0):
    """A fake model: the same logits for a chunk whatever its tokens, seeded per call order."""
    calls = iter(range(1000))
    return lambda ids: random_logits(seed * 1000 + next(calls), len(ids), scale)


def write_base(path, evaluate, tokens, n_chunks):
    writer = LogitsFileWriter(path, N_CTX, N_VOCAB, tokens, n_chunks)
    perplexity(evaluate, tokens, N_CTX, bos_id=None, n_chunks=n_chunks,
               on_scored=writer.write_chunk)
    writer.close()
    return LogitsFile.open(path)


TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, N_VOCAB, 4 * N_CTX)]


def test_stored_log_probs_are_llama_cpps_16_bit_rounding(tmp_path):
    base = write_base(tmp_path / "base.kld", model_of(1), TOKENS, 3)
    assert (base.n_ctx, base.n_vocab, base.n_chunks) == (N_CTX, N_VOCAB, 3)
    assert base.tokens.tolist() == TOKENS[:3 * N_CTX]
    assert base.rows.shape == (3, N_CTX - 1 - N_CTX // 2, row_values(N_VOCAB))
    # odd vocabulary: the row is padded to an even count, the pad left zero
    assert row_values(N_VOCAB) == N_VOCAB + 1 + 4 and not base.rows[..., -1].any()
    want = log_softmax(random_logits(1000)[N_CTX // 2:N_CTX - 1])
    got = base.base_log_probs(0)
    step = np.ascontiguousarray(base.rows[0, :, :4]).view(np.float32)[:, :1]
    above_floor = want > want.max(axis=1, keepdims=True) - 16
    assert np.all(np.abs(got - want)[above_floor] <= (step / 2 + 1e-5).repeat(N_VOCAB, 1)[
        above_floor])


def test_a_model_against_its_own_base_diverges_by_nothing(tmp_path):
    base = write_base(tmp_path / "base.kld", model_of(2), TOKENS, 4)
    result = kl_divergence(model_of(2), base, bos_id=None, n_vocab=N_VOCAB)
    assert result.count == 4 * (N_CTX - 1 - N_CTX // 2)
    kld, _ = result.mean_kld()
    assert abs(kld) < 1e-5 and result.same_top() == (1.0, 0.0)
    assert abs(result.log_ppl_ratio()[0]) < 1e-5


def test_divergence_is_the_kl_of_the_two_distributions(tmp_path):
    base = write_base(tmp_path / "base.kld", model_of(3, scale=1.0), TOKENS, 4)
    other = model_of(4, scale=1.0)
    result = kl_divergence(other, base, bos_id=None, n_vocab=N_VOCAB)
    want = []
    first = N_CTX // 2
    for c in range(4):
        p = log_softmax(random_logits(3000 + c, scale=1.0)[first:N_CTX - 1])
        q = log_softmax(random_logits(4000 + c, scale=1.0)[first:N_CTX - 1])
        want.append((np.exp(p) * (p - q)).sum(axis=1))
    want = np.concatenate(want)
    assert result.mean_kld()[0] == pytest.approx(want.mean(), rel=1e-3)
    lines = report(result)  # llama-perplexity prints its statistics from 100 positions on
    assert result.count < 100 and lines == []


def test_report_has_llama_perplexitys_lines(tmp_path):
    tokens = [int(t) for t in np.random.default_rng(8).integers(0, N_VOCAB, 20 * N_CTX)]
    base = write_base(tmp_path / "base.kld", model_of(5, scale=1.0), tokens, 20)
    lines = report(kl_divergence(model_of(6, scale=1.0), base, None, N_VOCAB))
    labels = [line.split(":")[0].strip() for line in lines if ":" in line]
    assert labels[:6] == ["Mean PPL(Q)", "Mean PPL(base)", "Cor(ln(PPL(Q)), ln(PPL(base)))",
                          "Mean ln(PPL(Q)/PPL(base))", "Mean PPL(Q)/PPL(base)",
                          "Mean PPL(Q)-PPL(base)"]
    assert "Mean    KLD" in labels and "Same top p" in labels and "RMS Δp" in labels


def test_quantized_rows_follow_llama_cpp_for_flat_and_wide_logits():
    flat = np.zeros((1, 4), np.float32)  # scale 0: every value stored as 0
    rows = quantize_log_probs(flat)
    scale, min_log_prob = rows[0, :4].view(np.float32)
    assert scale == 0 and min_log_prob == pytest.approx(-math.log(4)) and not rows[0, 4:].any()
    wide = np.array([[0, -10, -20, -40]], np.float32)  # below 16 nats: the floor
    rows = quantize_log_probs(wide)
    assert rows[0, 4:].tolist() == [65535, 24576, 0, 0]


def test_hostile_files_are_refused_by_name(tmp_path):
    bad = tmp_path / "text.kld"
    bad.write_text("not a logits file at all")
    with pytest.raises(LogitsFileError, match="does not look like a file containing log-prob"):
        LogitsFile.open(bad)
    base = write_base(tmp_path / "base.kld", model_of(1), TOKENS, 2)
    cut = tmp_path / "cut.kld"
    cut.write_bytes(open(base.path, "rb").read()[:-10])
    with pytest.raises(LogitsFileError, match="truncated"):
        LogitsFile.open(cut)
    with pytest.raises(LogitsFileError, match="inconsistent vocabulary .37 in the file, 50"):
        kl_divergence(model_of(1), base, None, n_vocab=50)


def test_a_failed_run_leaves_no_half_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "base.kld"
    path.write_bytes(b"earlier")
    writer = LogitsFileWriter(path, N_CTX, N_VOCAB, TOKENS, 2)

    def failing(ids):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        try:
            perplexity(failing, TOKENS, N_CTX, None, 2, on_scored=writer.write_chunk)
        except BaseException:
            writer.abort()
            raise
    assert path.read_bytes() == b"earlier" and list(tmp_path.iterdir()) == [path]


# ----------------------------------------------------------------------------- with llama.cpp


@pytest.fixture(scope="module")
def llama_cpp_base(golden_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("kld") / "llama_cpp_smollm2_c16.kld"
    path.write_bytes(gzip.decompress((golden_dir / "llama_cpp_smollm2_c16.kld.gz").read_bytes()))
    return path


def test_our_base_file_is_llama_cpps_format(smollm2_path, golden_dir, llama_cpp_base, tmp_path):
    ours = tmp_path / "ours.kld"
    text = golden_dir / "texts" / "apache-2.0.txt"
    assert main(["perplexity", "-m", str(smollm2_path), "-f", str(text), "-c", "16",
                 "--chunks", "1", "-t", "2", "--kl-divergence-base", str(ours)]) == 0
    theirs = LogitsFile.open(llama_cpp_base)
    mine = LogitsFile.open(ours)
    header = 20 + 4 * 16  # magic, n_ctx, n_vocab, n_chunk and the chunk's tokens: identical
    assert ours.read_bytes()[:header] == llama_cpp_base.read_bytes()[:header]
    assert ours.stat().st_size == llama_cpp_base.stat().st_size
    # the stored log-probabilities agree where they matter (the likely tokens). The Q4_1
    # model's products round activations to 8 bits (as ggml's do), so a last-bit change anywhere
    # (the order of an attention kernel's float sums) flips some roundings and moves single
    # log-probabilities by tenths: the mean stays at 0.09 while the largest moved from 0.31 to
    # 0.50 with such a change. Bound the mean tightly, the largest loosely.
    a, b = mine.base_log_probs(0), theirs.base_log_probs(0)
    likely = b > -8
    assert np.abs(a - b)[likely].mean() < 0.12
    assert np.abs(a - b)[likely].max() < 1.0


def test_llama_cpps_base_file_is_read(smollm2_path, llama_cpp_base, capsys):
    assert main(["perplexity", "-m", str(smollm2_path), "-c", "16", "-t", "2",
                 "--kl-divergence-base", str(llama_cpp_base), "--kl-divergence"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("chunk             PPL")
    fields = out[1].split()
    assert fields[0] == "1"
    kld = float(fields[7])  # chunk, PPL ± err, ratio ± err, KLD
    assert 0 <= kld < 0.02


def test_kl_divergence_flags_are_checked(tmp_path, capsys):
    assert main(["perplexity", "-m", "x.gguf", "--kl-divergence"]) == 2
    assert "--kl-divergence needs --kl-divergence-base" in capsys.readouterr().err
    assert main(["perplexity", "-m", "x.gguf"]) == 2
    assert "-f/--file is required" in capsys.readouterr().err
    junk = tmp_path / "junk.kld"
    junk.write_bytes(b"\0" * 64)
    assert main(["perplexity", "-m", "x.gguf", "--kl-divergence-base", str(junk),
                 "--kl-divergence"]) == 1
    assert "does not look like a file containing log-probabilities" in capsys.readouterr().err
