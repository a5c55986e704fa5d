"""Memory estimates and fit labels; the estimate against the engine's real peak RSS."""
import importlib.util
import os
import pathlib
import types

import pytest
from hub_server import hub_server, make_gguf, populate  # noqa: F401 (fixture)

from llamatui.inference import LoadConfig
from llamatui.app.cli import main
from llamatui.inference.gguf import GGUFFile
from llamatui.models import hub
from llamatui.inference.placement import auto_margin
from llamatui.models.recommend import (RAM_USABLE_FRACTION, ModelShape, assess, estimate,
                                       estimate_file, estimate_hub_info, estimate_remote,
                                       offload_plan, recommend)

MiB = 1 << 20
BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_memory.py"


def _hw(ram=64 << 30, vram=0):
    return types.SimpleNamespace(ram_available=ram, vram_free=vram)


def _shape(tmp_path, **kw) -> ModelShape:
    p = tmp_path / "m.gguf"
    p.write_bytes(make_gguf(**kw))
    with GGUFFile.open(p) as g:
        return ModelShape.from_gguf(g)


def test_kv_cache_arithmetic(tmp_path):
    shape = _shape(tmp_path, n_layer=2, n_embd=256, n_head=4, n_head_kv=2)  # head_dim 64
    est = estimate(shape, n_ctx=1024)
    assert est.kv_bytes == 2 * 1024 * 2 * (64 + 64) * 2  # layers, cells, heads, K+V, f16
    assert est.kv_bytes == est.kv_bytes_llama_cpp  # no sliding window
    assert estimate(shape, 1024, "f32", "f32").kv_bytes == 2 * est.kv_bytes
    assert estimate(shape, 1024, "q8_0", "q8_0").kv_bytes == est.kv_bytes * 34 // 64
    assert est.kv_bytes_per_token * 1024 == est.kv_bytes
    assert est.weights_bytes == (tmp_path / "m.gguf").stat().st_size
    assert est.total_bytes == sum(b for _, b, _ in est.breakdown())
    assert est.resident_at(1024) == est.total_bytes
    assert est.resident_at(10) < est.total_bytes
    assert estimate(shape, n_ctx=0).n_ctx == 4096  # the training context
    with pytest.raises(ValueError):
        estimate(shape, 1024, "q4_0")


def test_encoders_have_no_kv_cache(tmp_path):
    """An embedding model (BERT) attends without the cache: the estimate counts none, as the
    engine allocates none."""
    from synthetic_models import write_model

    from llamatui.inference.model import Model
    path = write_model("bert", "F16", tmp_path)
    with GGUFFile.open(path) as g:
        shape = ModelShape.from_gguf(g)
        model = Model.load(g, LoadConfig(n_ctx=512))
        assert model.kv.nbytes == 0
    est = estimate(shape, n_ctx=512)
    assert shape.encoder and est.kv_bytes == est.kv_bytes_per_token == 0
    assert est.layer_bytes(0) == shape.layer_bytes[0]  # what offloading a layer moves: no KV


def test_sliding_window_engine_vs_llama_cpp(tmp_path):
    """Gemma 3: layer il is local when il % 6 < 5. The engine allocates n_ctx cells on every
    layer; llama.cpp caps the local ones at pad(window + n_ubatch, 256)."""
    shape = _shape(tmp_path, arch="gemma3", n_layer=12, n_head_kv=1, n_head=4, n_embd=256,
                   sliding_window=128)
    assert shape.swa_layers == tuple(il % 6 < 5 for il in range(12)) and shape.n_swa == 128
    per_layer_token = 1 * (64 + 64) * 2
    est = estimate(shape, n_ctx=8192)
    assert est.kv_bytes == 12 * 8192 * per_layer_token
    assert est.kv_bytes_llama_cpp == (10 * 768 + 2 * 8192) * per_layer_token
    assert "llama.cpp" in dict((k, n) for k, _, n in est.breakdown())["KV cache"]
    small = estimate(shape, n_ctx=512)  # the window cap above n_ctx changes nothing
    assert small.kv_bytes == small.kv_bytes_llama_cpp


def test_real_models_shapes(smollm2_path, gemma3_path):
    s = estimate_file(smollm2_path, n_ctx=2048)
    assert s.shape.n_layer == 30 and s.shape.n_head_kv == [3] * 30 and s.shape.n_vocab == 49152
    assert s.kv_bytes == 30 * 2048 * 3 * 128 * 2
    assert s.shape.engine_supported and s.shape.n_merges == 48900
    g = estimate_file(gemma3_path, n_ctx=2048)
    assert g.shape.swa_layers.count(False) == 3 and g.shape.n_swa == 512
    assert g.kv_bytes == 18 * 2048 * 512 * 2
    assert g.kv_bytes_llama_cpp == (15 * 1024 + 3 * 2048) * 512 * 2


def test_engine_types_are_the_types_with_cpu_kernels():
    from llamatui.inference.catalog import MIXES_BY_NAME
    from llamatui.inference.quants import kernels_of
    from llamatui.inference.support import engine_types, mix_runs_here, runs_here
    assert engine_types() == frozenset(kernels_of("cpu")) >= {"F32", "BF16", "Q4_K", "IQ4_XS"}
    assert mix_runs_here(MIXES_BY_NAME["Q4_K_M"]) and mix_runs_here(MIXES_BY_NAME["IQ2_XS"])
    assert runs_here("llama", ["Q4_K", "Q6_K", "F32"])
    assert not runs_here("llama", ["Q4_K", "NVFP4"]) and not runs_here("mamba", ["Q4_K"])


def test_remote_header_gives_the_same_estimate(hub_server, smollm2_path, gemma3_path):
    """The starter models served by the stand-in Hub: their headers read by Range requests
    (Gemma's 6.5 MB header takes several) estimate exactly as the local files do."""
    repo = hub_server.add_repo("test/starters")
    for p in (smollm2_path, gemma3_path):
        repo.add(p.name, disk=p)
    for p in (smollm2_path, gemma3_path):
        remote = estimate_remote("test/starters", p.name, n_ctx=2048)
        local = estimate_file(p, n_ctx=2048)
        assert remote.total_bytes == local.total_bytes
        assert remote.kv_bytes_llama_cpp == local.kv_bytes_llama_cpp
        assert remote.shape.source == "remote header"
        sent = sum(r["sent"] for r in hub_server.file_requests(p.name))
        assert sent < p.stat().st_size / 10  # the header, not the model


def test_hub_info_fallback_is_approximate():
    info = hub.GGUFSummary(parameters=8_030_261_248, architecture="llama",
                           context_length=131072, chat_template=True)
    est = estimate_hub_info(info, file_bytes=4_920_000_000, n_ctx=8192)
    assert est.approximate and est.shape.source == "hub info"
    # Llama 3 8B at 8k: 1 GiB of f16 KV in reality; the guess must be within 2x
    assert 0.5 * (1 << 30) < est.kv_bytes < 2 * (1 << 30)
    assert 5.2e9 < est.total_bytes < 7.5e9


def test_labels(smollm2_path):
    est = estimate_file(smollm2_path, n_ctx=2048)
    need = est.total_bytes
    assert assess(est, _hw(ram=64 << 30)).label == "fits in RAM"
    assert assess(est, _hw(ram=int(need / RAM_USABLE_FRACTION) - MiB)).label == "too large"
    big_gpu = assess(est, _hw(ram=8 << 30, vram=24 << 30))
    # all 30 layers and the output layer, llama.cpp's "offloaded 31/31 layers"
    assert big_gpu.label == "fits in GPU" and big_gpu.gpu_layers == 31
    assert big_gpu.ram_bytes < need and big_gpu.vram_bytes > est.weights_bytes * 0.9
    # -ngl auto keeps the margin free, then takes the output layer and the last layers
    room = auto_margin(est.gpu_work_bytes) + est.shape.output_bytes + sum(
        est.layer_bytes(il) for il in range(21, 30)) + 1000
    partial = assess(est, _hw(ram=8 << 30, vram=room))
    assert partial.kind == "partial" and partial.label == "partial GPU offload (10 layers)"
    assert partial.ram_bytes < need
    assert offload_plan(est, [room]).n_gpu_layers == 10
    tiny_gpu = assess(est, _hw(ram=8 << 30, vram=auto_margin(est.gpu_work_bytes) + MiB))
    assert tiny_gpu.label == "fits in RAM"
    assert assess(est, _hw(ram=1 << 20, vram=room)).label == "too large"


def test_gpu_label_is_the_loaders_plan(smollm2_path):
    """The recommender's label and -ngl auto plan with the same sizes: the engine's own count of
    layer, output and KV bytes for the file."""
    from llamatui.inference.catalog import get_arch
    from llamatui.inference.placement import model_sizes, work_bytes
    from llamatui.inference.gguf import GGUFFile
    from llamatui.inference.hparams import read_hparams
    est = estimate_file(smollm2_path, n_ctx=2048)
    with GGUFFile.open(smollm2_path) as g:
        hp = read_hparams(g, get_arch("llama"))
        layers, output, kv = model_sizes(g, hp, 2048, "f16", "f16")
        assert work_bytes(g, hp, 2048, est.n_ubatch) == est.gpu_work_bytes
    assert (layers, output) == (est.shape.layer_bytes, est.shape.output_bytes)
    assert kv == [est.layer_bytes(il) - layers[il] for il in range(hp.n_layer)]


def test_recommend_picks_the_best_that_fits(hub_server):
    populate(hub_server)
    listing = hub.list_files("acme/Tiny-GGUF")
    roomy = recommend(listing, _hw(ram=64 << 30), n_ctx=4096)
    assert roomy.shape_source == "remote header"
    fits = {f.quant: f for f in roomy.fits}
    assert fits["IQ2_XS"].supported is True
    assert fits["Q6_K"].supported is True and "split" not in fits["Q6_K"].note  # 2 shards
    assert roomy.best.quant == "Q8_0" and roomy.best.label == "fits in RAM"
    # A wider model, where file sizes outweigh kernels: RAM just under the Q8_0 need leaves
    # Q4_K_M and Q2_K, and Q4_K_M is the better one.
    mid = hub_server.add_repo("acme/Mid-GGUF")
    for q in ("Q8_0", "Q4_K_M", "Q2_K"):
        mid.add(f"Mid-{q}.gguf", make_gguf(q, n_layer=4, n_embd=1024, n_ff=4096, n_head=8,
                                           n_head_kv=8))
    wide = hub.list_files("acme/Mid-GGUF")
    need = {f.quant: f.estimate.total_bytes for f in recommend(wide, _hw(), 4096).fits}
    assert need["Q8_0"] > need["Q4_K_M"] > need["Q2_K"]
    ram = int((need["Q8_0"] - 1) / RAM_USABLE_FRACTION)
    tight = recommend(wide, _hw(ram=ram), n_ctx=4096)
    labels = {f.quant: f.label for f in tight.fits}
    assert labels == {"Q8_0": "too large", "Q4_K_M": "fits in RAM", "Q2_K": "fits in RAM"}
    assert tight.best.quant == "Q4_K_M"
    breakdown = dict((k, v) for k, v, _ in tight.best.estimate.breakdown())
    assert breakdown["weights (mmap'd file)"] == wide.group("Q4_K_M").size
    gpu = recommend(listing, _hw(ram=ram, vram=8 << 30), n_ctx=4096)
    assert gpu.best.quant == "Q8_0" and gpu.best.label == "fits in GPU"
    nothing = recommend(listing, _hw(ram=1 << 20), n_ctx=4096)
    assert nothing.best is None and {f.label for f in nothing.fits} == {"too large"}
    # without headers: the Hub's gguf summary
    est = recommend(listing, _hw(), n_ctx=4096, fetch_header=False)
    assert est.shape_source == "hub info" and est.best is not None


def test_search_files_command(hub_server, capsys, monkeypatch):
    populate(hub_server)
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["search", "--files", "acme/Tiny-GGUF", "-c", "2048"]) == 0
    out = capsys.readouterr().out
    assert "Q4_K_M" in out and "fits in" in out and "recommended" in out
    # every quant of the listing runs now, IQ2_XS included (the low-bit kernels)
    assert "IQ2_XS" in out and "not supported by the engine" not in out
    assert "mmproj-Tiny-F16.gguf" in out


# ----------------------------------------------------------------------------- honesty


def _bench():
    spec = importlib.util.spec_from_file_location("bench_memory", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_estimate_matches_peak_rss(which, request):
    """Engine.load(path, LoadConfig(n_ctx=2048, threads=2)) in a fresh process, a chat prompt,
    4 tokens: peak RSS (VmHWM) against the estimate for the tokens in the cache, within 15 %.
    The full-context estimate must also cover this run."""
    path = request.getfixturevalue(which)
    row = _bench().compare(path, n_prompt=16, n_ctx=2048, threads=2)
    print(f"\n{row['model']}: peak RSS {row['peak_rss'] / MiB:.1f} MiB, estimate "
          f"{row['estimate_at_use'] / MiB:.1f} MiB ({row['error'] * 100:+.1f}%), "
          f"full context {row['estimate_full_context'] / MiB:.1f} MiB, "
          f"{row['compiled']} kernels compiled in the run; marks (MiB): "
          + ", ".join(f"{k} {v / MiB:.0f}" for k, v in row["measured"]["marks"].items()))
    assert abs(row["error"]) < 0.15
    assert row["estimate_full_context"] > row["peak_rss"]


@pytest.mark.skipif(not os.environ.get("LLAMATUI_FULL_MEMORY_TEST"),
                    reason="fills a 2048-token context (a minute per model on 2 cores); set "
                           "LLAMATUI_FULL_MEMORY_TEST=1")
@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_full_context_estimate_matches_peak_rss(which, request):
    path = request.getfixturevalue(which)
    row = _bench().compare(path, n_prompt=2000, n_ctx=2048, threads=2)
    print(f"\n{row['model']}: {row['kv_used']} tokens, peak RSS {row['peak_rss'] / MiB:.1f} MiB,"
          f" estimate {row['estimate_at_use'] / MiB:.1f} MiB ({row['error'] * 100:+.1f}%)")
    assert row["kv_used"] > 1900
    assert abs(row["error"]) < 0.15


def test_split_model_estimate_counts_every_shard(hub_server, tmp_path, monkeypatch):
    populate(hub_server)
    group = hub.list_files("acme/Tiny-GGUF").group("Q6_K")
    est = estimate_remote("acme/Tiny-GGUF", group.first.path, file_bytes=group.size)
    assert est.weights_bytes == group.size
    assert sum(est.shape.layer_bytes) + est.shape.other_bytes <= group.size
    assert min(est.shape.layer_bytes) > 0  # layers of the other shard are counted too
    # the same from local shards
    from llamatui.models.download import pull
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path))
    local = estimate_file(pull("acme/Tiny-GGUF:Q6_K").path)
    assert local.weights_bytes == group.size and local.shape.n_params > est.shape.n_params


@pytest.mark.parametrize("case", ["gemma4", "qwen35"])
def test_estimate_counts_the_cache_the_family_allocates(case, tmp_path):
    """Gemma 4's layers that reuse an earlier layer's KV and Qwen 3.5's recurrent layers keep
    no K/V: the estimate (and the offload plan's per-layer figure) counts what the engine
    allocates, not n_head_kv * head_dim on every layer."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from synthetic_models import write_model

    from llamatui.inference.model import Model
    path = write_model(case, "F16", tmp_path)
    est = estimate_file(path, n_ctx=256)
    model = Model.load(path, LoadConfig(n_ctx=256))
    try:
        kv = model.kv
        allocated = kv.nbytes - getattr(kv, "state_bytes", 0)
    finally:
        model.close()
    assert est.kv_bytes == allocated
    s = est.shape
    uniform = sum(h * (s.head_dim_k + s.head_dim_v) * 2 * 256 for h in s.n_head_kv)
    assert est.kv_bytes < uniform
    # what offloading each layer moves: its weights and its own cache
    assert sum(est.layer_bytes(il) - s.layer_bytes[il] for il in range(s.n_layer)) == est.kv_bytes
