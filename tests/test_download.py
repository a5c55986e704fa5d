"""Downloads from the stand-in Hub: progress, cancel and resume by another process, verification,
errors, disk space; then the store's listing, resolving and deleting, and the CLI around them."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hub_server import child_env, hub_server, populate  # noqa: F401 (fixture)

from llamatui.app.cli import main
from llamatui.models import store
from llamatui.models.download import (ChecksumError, DownloadCancelled, download_file, pull)
from llamatui.models.hub import EntryNotFoundError, GatedRepoError, RepoNotFoundError
from llamatui.models.store import (StoreError, delete_model, list_models, list_partials,
                                   resolve_model, store_dir)

REPO = "acme/Tiny-GGUF"
BIG = "Tiny-Q4_K_M.gguf"  # ~3.9 MB


@pytest.fixture
def hubsrv(hub_server, tmp_path, monkeypatch):
    populate(hub_server)
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path))
    return hub_server


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _final(tmp_path, name=BIG):
    return tmp_path / "models" / "acme" / "Tiny-GGUF" / name


def _store_files(tmp_path):
    """Everything under the store except lock files."""
    root = tmp_path / "models"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not p.name.endswith(".lock"))


PULL_SCRIPT = ("import sys; from llamatui.models.download import pull; "
               "r = pull(sys.argv[1]); print(r.path)")


def test_download_with_progress_and_sidecar(hubsrv, tmp_path):
    hubsrv.throttle = 8e6  # ~0.5 s for the file: several reports with a rate
    seen = []
    result = pull(f"{REPO}:Q4_K_M", progress=seen.append)
    f = hubsrv.repos[REPO].files[BIG]
    assert result.path == _final(tmp_path) and result.quant == "Q4_K_M"
    assert _sha(result.path) == f.sha256
    side = json.loads(result.path.with_name(BIG + ".json").read_text())
    assert side["repo"] == REPO and side["file"] == BIG and side["sha256"] == f.sha256
    assert side["revision"] == hubsrv.repos[REPO].sha and side["source"] == "hf"
    assert side["size"] == f.size and side["quant"] == "Q4_K_M"
    downloading = [p for p in seen if p.stage == "downloading"]
    assert len(downloading) >= 3
    assert all(a.done <= b.done for a, b in zip(downloading, downloading[1:]))
    assert downloading[-1].done == f.size and all(p.total == f.size for p in seen)
    assert any(p.rate > 1e6 and p.eta is not None for p in downloading)
    assert seen[-1].stage == "done"
    # The bytes came from the pinned commit, through the "CDN" redirect.
    gets = [r for r in hubsrv.file_requests(BIG) if r["method"] == "GET"]
    assert any(hubsrv.repos[REPO].sha in r["path"] for r in gets)
    # a second pull downloads nothing
    n = len(hubsrv.file_requests("/cdn/"))
    assert pull(f"{REPO}:Q4_K_M").path == result.path
    assert len(hubsrv.file_requests("/cdn/")) == n
    assert _store_files(tmp_path) == [f"acme/Tiny-GGUF/{BIG}", f"acme/Tiny-GGUF/{BIG}.json"]


def test_split_model_pull_and_listing(hubsrv, tmp_path):
    seen = []
    result = pull(f"{REPO}:Q6_K", progress=seen.append)
    total = sum(p.stat().st_size for p in result.files)
    assert {(p.file_index, p.file_count) for p in seen} == {(1, 2), (2, 2)}
    assert seen[-1].overall_done == seen[-1].overall_total == total
    overall = [p.overall_done for p in seen]
    assert overall == sorted(overall)
    assert [p.name for p in result.files] == ["Tiny-Q6_K-00001-of-00002.gguf",
                                              "Tiny-Q6_K-00002-of-00002.gguf"]
    assert result.path == result.files[0]
    models = list_models()
    assert len(models) == 1 and models[0].files == result.files
    assert models[0].size == sum(p.stat().st_size for p in result.files)
    assert models[0].quantization == "Q6_K" and models[0].repo == REPO
    assert resolve_model(f"{REPO}:Q6_K") == result.path


def test_cancel_at_half_then_resume_in_a_new_process(hubsrv, tmp_path):
    hubsrv.throttle = 4e6
    f = hubsrv.repos[REPO].files[BIG]
    cancel = threading.Event()

    def progress(p):
        if p.stage == "downloading" and p.done >= f.size // 2:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="pull it again to continue"):
        download_file(REPO, BIG, progress=progress, cancel=cancel)
    final = _final(tmp_path)
    partial = final.with_name(f".{BIG}.partial")
    assert not final.exists() and partial.exists()
    done = partial.stat().st_size
    assert f.size // 2 <= done < f.size
    meta = json.loads(partial.with_name(partial.name + ".json").read_text())
    assert meta["sha256"] == f.sha256 and meta["size"] == f.size
    assert meta["url"].endswith(f"/resolve/{hubsrv.repos[REPO].sha}/{BIG}")
    [p] = list_partials()
    assert (p.repo, p.file, p.done, p.total) == (REPO, BIG, done, f.size)

    hubsrv.throttle = None
    n_requests = len(hubsrv.requests)
    out = subprocess.run([sys.executable, "-c", PULL_SCRIPT, f"{REPO}:Q4_K_M"],
                         env=child_env(hubsrv, tmp_path / "models"), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(final)
    assert _sha(final) == f.sha256 and not partial.exists()
    cdn = [r for r in hubsrv.requests[n_requests:] if r["path"].startswith("/cdn/")
           and r["method"] == "GET"]
    assert [r["headers"].get("range") for r in cdn] == [f"bytes={done}-"]
    assert cdn[0]["headers"].get("if-range") == f'"{f.sha256}"'
    assert cdn[0]["sent"] == f.size - done  # only the rest was sent
    assert list_partials() == []


def test_killed_download_resumes_in_a_new_process(hubsrv, tmp_path):
    f = hubsrv.repos[REPO].files[BIG]
    half = f.size // 2
    hubsrv.pause_at[BIG] = half
    env = child_env(hubsrv, tmp_path / "models")
    first = subprocess.Popen([sys.executable, "-c", PULL_SCRIPT, f"{REPO}:Q4_K_M"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = _final(tmp_path).with_name(f".{BIG}.partial")
    try:
        assert hubsrv.paused.wait(60), "the first download never reached the pause"
        deadline = time.time() + 20
        while time.time() < deadline and not (partial.exists()
                                               and partial.stat().st_size == half):
            time.sleep(0.05)
        assert partial.stat().st_size == half
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    hubsrv.pause_at.clear()
    hubsrv.release.set()
    n_requests = len(hubsrv.requests)
    out = subprocess.run([sys.executable, "-c", PULL_SCRIPT, f"{REPO}:Q4_K_M"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    final = _final(tmp_path)
    assert _sha(final) == f.sha256 and not partial.exists()
    cdn = [r for r in hubsrv.requests[n_requests:] if r["path"].startswith("/cdn/")]
    assert cdn[0]["headers"].get("range") == f"bytes={half}-"


def test_changed_file_restarts_cleanly(hubsrv, tmp_path):
    """If-Range no longer matches (the server answers 200): the download starts over."""
    f = hubsrv.repos[REPO].files[BIG]
    cancel = threading.Event()
    hubsrv.throttle = 4e6
    with pytest.raises(DownloadCancelled):
        download_file(REPO, BIG, cancel=cancel,
                      progress=lambda p: p.done > f.size // 3 and cancel.set())
    hubsrv.throttle = None
    hubsrv.etag_salt = "-v2"
    n_requests = len(hubsrv.requests)
    path = download_file(REPO, BIG)
    assert _sha(path) == f.sha256
    cdn = [r for r in hubsrv.requests[n_requests:] if r["path"].startswith("/cdn/")]
    assert cdn[0]["headers"].get("range", "").startswith("bytes=")  # it asked to resume
    assert cdn[0]["sent"] == f.size  # and got the whole file again


def test_server_without_ranges(hubsrv, tmp_path):
    f = hubsrv.repos[REPO].files[BIG]
    cancel = threading.Event()
    hubsrv.throttle = 4e6
    with pytest.raises(DownloadCancelled):
        download_file(REPO, BIG, cancel=cancel,
                      progress=lambda p: p.done > f.size // 3 and cancel.set())
    hubsrv.throttle = None
    hubsrv.ignore_range = True
    assert _sha(download_file(REPO, BIG)) == f.sha256


def test_corrupt_download_is_rejected(hubsrv, tmp_path):
    hubsrv.corrupt.add(BIG)
    with pytest.raises(ChecksumError, match="corrupt and was discarded"):
        pull(f"{REPO}:Q4_K_M")
    assert _store_files(tmp_path) == []
    assert list_models() == []


def test_disk_full_is_refused_before_downloading(hubsrv, tmp_path, monkeypatch):
    class Tiny:
        f_bavail, f_frsize, f_blocks = 10, 4096, 100
    monkeypatch.setattr(os, "statvfs", lambda p: Tiny())
    with pytest.raises(StoreError, match="not enough disk space"):
        pull(f"{REPO}:Q4_K_M")
    assert hubsrv.file_requests("/cdn/") == []
    with pytest.raises(StoreError, match="not enough disk space"):
        download_file(REPO, BIG)
    assert hubsrv.file_requests("/cdn/") == []


def test_missing_gated_and_private(hubsrv, tmp_path):
    with pytest.raises(RepoNotFoundError, match="not found"):
        pull("acme/Nope-GGUF")
    with pytest.raises(EntryNotFoundError, match="no Q3_K_S file"):
        pull(f"{REPO}:Q3_K_S")
    with pytest.raises(EntryNotFoundError, match="no such file"):
        download_file(REPO, "nope.gguf")
    with pytest.raises(GatedRepoError, match="accept its license at .*acme/Gated-GGUF"):
        pull("acme/Gated-GGUF")
    with pytest.raises(RepoNotFoundError, match="private"):
        pull("acme/Private-GGUF:Q4_K_M")
    assert _store_files(tmp_path) == []


def test_offline_pull_returns_what_is_there(hubsrv, tmp_path):
    path = pull(f"{REPO}:Q8_0").path
    hubsrv.stop()
    again = pull(f"{REPO}:Q8_0")
    assert again.path == path and again.already_present and again.listing is None


def test_ls_rm_and_resolve(hubsrv, tmp_path, capsys, monkeypatch, smollm2_path):
    pull(f"{REPO}:Q4_K_M")
    pull(f"{REPO}:Q8_0")
    # a starter model beside them (a link to the tests' copy)
    starter = store_dir() / smollm2_path.name
    os.link(smollm2_path, starter) if os.stat(smollm2_path).st_dev == \
        os.stat(tmp_path).st_dev else starter.write_bytes(smollm2_path.read_bytes())
    store.update_sidecar(starter, source="pypi", starter="smollm2-135m")
    store.mark_used(_final(tmp_path))

    monkeypatch.setenv("COLUMNS", "160")
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert f"{REPO}:Q4_K_M" in out and f"{REPO}:Q8_0" in out and "llama" in out
    assert "4096" in out and "1.4M" in out and "hub" in out
    assert "starter" in out and "SmolLM2-135M-Instruct.Q4_1.gguf" in out
    assert main(["ls", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    q4 = listed[f"acme/Tiny-GGUF/{BIG}"]
    assert q4["architecture"] == "llama" and q4["quantization"] == "Q4_K_M"
    assert q4["context_length"] == 4096 and q4["parameters"] > 1_000_000
    assert q4["source"] == "hf" and q4["repo"] == REPO and q4["last_used"] is not None
    assert q4["ref"] == f"{REPO}:Q4_K_M"
    smol = listed["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert smol["parameters"] == 134_515_008 and smol["quantization"] == "Q4_1"
    assert smol["context_length"] == 8192 and smol["source"] == "pypi"

    assert resolve_model(f"{REPO}:Q4_K_M") == _final(tmp_path)
    assert resolve_model(REPO) == _final(tmp_path)  # Q4_K_M by default
    assert resolve_model(BIG) == _final(tmp_path)  # by file name
    with pytest.raises(StoreError, match="not downloaded yet; run `llamatui pull"):
        resolve_model("acme/NoDefault-GGUF:Q8_0")

    usage = store.disk_usage()
    assert usage.n_models == 3 and usage.models_bytes == sum(
        m["size"] for m in listed.values())

    assert main(["rm", f"{REPO}:Q8_0"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not _final(tmp_path, "Tiny-Q8_0.gguf").exists()
    assert not _final(tmp_path, "Tiny-Q8_0.gguf.json").exists()
    removed = delete_model(f"acme/Tiny-GGUF/{BIG}")
    assert removed == [_final(tmp_path)]
    assert not (tmp_path / "models" / "acme").exists()  # empty folders go too
    assert main(["rm", "nothing-here"]) == 1
    assert "no model 'nothing-here'" in capsys.readouterr().err
    assert [m.name for m in list_models()] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_pull_command(hubsrv, tmp_path, capsys):
    # a huggingface.co URL names the repo and file; the bytes come from HF_ENDPOINT
    assert main(["pull", f"https://huggingface.co/{REPO}/blob/main/Tiny-Q2_K.gguf"]) == 0
    assert capsys.readouterr().out.strip() == str(_final(tmp_path, "Tiny-Q2_K.gguf"))
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    assert capsys.readouterr().out.strip() == str(_final(tmp_path, "Tiny-Q8_0.gguf"))
    assert main(["pull", "acme/Gated-GGUF"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("llamatui pull: error:") and "gated" in err
    assert "Traceback" not in err
    assert main(["pull", "no-such-starter"]) == 1
    assert "neither a starter model" in capsys.readouterr().err
