"""Downloads from the stand-in Hub: progress, cancel and resume by another process, verification,
errors, disk space; then the store's listing, resolving and deleting, and the CLI around them;
then what must not be left behind: stalled or closing servers, leftovers of killed runs, damaged
partials, a read-only store."""
import builtins
import errno
import hashlib
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from hub_server import child_env, hub_server, populate  # noqa: F401 (fixture)

from llamatui.app.cli import main
from llamatui.models import download, store
from llamatui.models.download import (ChecksumError, DownloadCancelled, DownloadInterrupted,
                                      download_file, pull)
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


def _one_line_error(err: str, command: str) -> str:
    """The error line of a command's stderr (a progress bar may come before it)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert lines and lines[-1].startswith(f"llamatui {command}: error: "), err
    assert not any("error" in line for line in lines[:-1]), err
    return lines[-1]


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


# ------------------------------------------------------------------------- leaving nothing behind


def _cdn_gets(server, since=0):
    return [r for r in server.requests[since:] if r["path"].startswith("/cdn/")
            and r["method"] == "GET"]


def _cancel_at_a_third(server):
    """Leaves a partial download of a third of BIG behind."""
    f = server.repos[REPO].files[BIG]
    cancel = threading.Event()
    server.throttle = 4e6
    with pytest.raises(DownloadCancelled):
        download_file(REPO, BIG, cancel=cancel,
                      progress=lambda p: p.done > f.size // 3 and cancel.set())
    server.throttle = None


def test_partial_replaced_by_a_directory_recovers(hubsrv, tmp_path, capsys):
    _cancel_at_a_third(hubsrv)
    partial = _final(tmp_path).with_name(f".{BIG}.partial")
    partial.unlink()
    (partial / "sub").mkdir(parents=True)  # a directory where the partial file goes
    (partial / "sub" / "x").write_bytes(b"x")
    meta = partial.with_name(partial.name + ".json")
    meta.unlink()
    meta.mkdir()
    assert main(["pull", f"{REPO}:Q4_K_M"]) == 0
    assert capsys.readouterr().out.strip() == str(_final(tmp_path))
    assert _sha(_final(tmp_path)) == hubsrv.repos[REPO].files[BIG].sha256
    assert _store_files(tmp_path) == [f"acme/Tiny-GGUF/{BIG}", f"acme/Tiny-GGUF/{BIG}.json"]


def test_server_that_stops_sending_ends_within_one_read_timeout(hubsrv, tmp_path, capsys,
                                                                monkeypatch):
    """It announces the whole file, sends a third, then nothing: one read timeout, a message
    that says so, and the next pull continues from that third."""
    monkeypatch.setattr(download, "READ_TIMEOUT", 1.0)
    f = hubsrv.repos[REPO].files[BIG]
    third = f.size // 3
    hubsrv.pause_at[BIG] = third
    t0 = time.monotonic()
    assert main(["pull", f"{REPO}:Q4_K_M"]) == 1
    took = time.monotonic() - t0
    err = _one_line_error(capsys.readouterr().err, "pull")
    assert "cannot reach" not in err
    assert f"the server stopped sending after {third} of {f.size} bytes (nothing for 1 s)" in err
    assert len(_cdn_gets(hubsrv)) == 1 and took < 1.0 + 3  # no second wait, no retry
    partial = _final(tmp_path).with_name(f".{BIG}.partial")
    assert partial.stat().st_size == third

    hubsrv.pause_at.clear()
    hubsrv.release.set()
    n = len(hubsrv.requests)
    assert pull(f"{REPO}:Q4_K_M").path == _final(tmp_path)
    assert _sha(_final(tmp_path)) == f.sha256 and not partial.exists()
    assert [r["headers"].get("range") for r in _cdn_gets(hubsrv, n)] == [f"bytes={third}-"]


def test_server_that_closes_the_connection_early(hubsrv, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRY_PAUSE", 0.01)
    f = hubsrv.repos[REPO].files[BIG]
    # Closing after every sixth of the file: each reconnection makes progress, so it completes
    # (more reconnections than RETRIES).
    hubsrv.close_every[BIG] = f.size // 6 + 1
    assert _sha(download_file(REPO, BIG)) == f.sha256
    assert len(_cdn_gets(hubsrv)) == 6 > download.RETRIES + 1
    _final(tmp_path).unlink()
    hubsrv.close_every.clear()

    # Always closing at the same byte: RETRIES reconnections without progress, then a message.
    half = f.size // 2
    hubsrv.close_at[BIG] = half
    n = len(hubsrv.requests)
    with pytest.raises(DownloadInterrupted, match=f"the server closed the connection after "
                       f"{half} of {f.size} bytes, 4 times in a row; pull again to continue"):
        download_file(REPO, BIG)
    assert len(_cdn_gets(hubsrv, n)) == download.RETRIES + 1
    hubsrv.close_at.clear()
    n = len(hubsrv.requests)
    assert _sha(download_file(REPO, BIG)) == f.sha256
    assert [r["headers"].get("range") for r in _cdn_gets(hubsrv, n)] == [f"bytes={half}-"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_pull_removes_what_killed_runs_left(hubsrv, tmp_path):
    """Partial files of a writer whose process is gone (and old-style unnamed ones, by age)
    are removed by the next pull; a partial download and a live writer's file stay."""
    folder = tmp_path / "models" / "acme" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    dead = folder / f".Tiny-Q4_K_M-local.gguf.partial-{_dead_pid()}-abc123"
    dead.write_bytes(b"\0" * 5000)
    old_style = tmp_path / "models" / ".partial-k2j4h5g6.gguf"
    old_style.write_bytes(b"\0" * 3000)
    an_hour_ago = time.time() - 2 * 3600
    os.utime(old_style, (an_hour_ago, an_hour_ago))
    recent_old_style = tmp_path / "models" / ".partial-aaaabbbb.gguf"  # listed first
    recent_old_style.write_bytes(b"\0" * 10)
    mine = folder / f".Tiny-Q2_K-local.gguf.partial-{os.getpid()}-def456"  # a live writer
    mine.write_bytes(b"\0" * 100)
    usage = store.disk_usage()
    assert (usage.n_incomplete, usage.incomplete_bytes) == (4, 8110)
    assert [(p.target, p.abandoned) for p in store.list_incomplete()] == [
        (None, False), (None, True), (str(folder / "Tiny-Q2_K-local.gguf"), False),
        (str(folder / "Tiny-Q4_K_M-local.gguf"), True)]
    _cancel_at_a_third(hubsrv)
    pull(f"{REPO}:Q8_0")
    assert not dead.exists() and not old_style.exists()
    assert recent_old_style.exists() and mine.exists()
    assert [p.done for p in store.list_partials()] == [os.path.getsize(
        folder / f".{BIG}.partial")]


# A read-only store. Tests run as root, whom chmod does not stop, and mounting needs privileges:
# every write-intent call on a path under the store fails as a read-only file system answers.


@pytest.fixture
def read_only_store(monkeypatch):
    def make(root: pathlib.Path):
        root = os.path.realpath(root)

        def inside(path) -> bool:
            if isinstance(path, int):
                return False
            p = os.path.realpath(os.fsdecode(path))
            return p == root or p.startswith(root + os.sep)

        def refuse(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

        def guard(real, writes=lambda *a, **k: True):
            def wrapper(path, *args, **kwargs):
                if inside(path) and writes(*args, **kwargs):
                    refuse(path)
                return real(path, *args, **kwargs)
            return wrapper

        def writes_flags(flags, *a, **k):
            return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))

        def writes_mode(mode="r", *a, **k):
            return any(c in mode for c in "wax+")

        def mkdir(path, *args, **kwargs):
            if inside(path) and os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            return guard(real_mkdir)(path, *args, **kwargs)

        real_mkdir = os.mkdir
        monkeypatch.setattr(os, "open", guard(os.open, writes_flags))
        monkeypatch.setattr(builtins, "open", guard(builtins.open, writes_mode))
        monkeypatch.setattr(io, "open", guard(io.open, writes_mode))
        monkeypatch.setattr(os, "mkdir", mkdir)
        for name in ("unlink", "remove", "rmdir", "replace", "rename", "utime", "chmod"):
            monkeypatch.setattr(os, name, guard(getattr(os, name)))
    return make




def test_read_only_store(hubsrv, tmp_path, capsys, smollm2_path, read_only_store):
    pull(f"{REPO}:Q8_0")
    starter = store_dir() / smollm2_path.name
    shutil.copyfile(smollm2_path, starter)
    store.update_sidecar(starter, source="pypi", starter="smollm2-135m")
    before = _store_files(tmp_path)
    read_only_store(store_dir())
    with pytest.raises(OSError, match="Read-only file system"):  # the simulation works
        (store_dir() / "x").write_bytes(b"")

    # Present models: said so, exit 0.
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(_final(tmp_path, "Tiny-Q8_0.gguf"))
    assert out.err.strip() == f"{REPO}:Q8_0 is already in the store"
    assert main(["pull", "smollm2-135m"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(starter)
    assert out.err.strip() == "smollm2-135m is already in the store"
    assert main(["ls"]) == 0 and "\n2 models, " in capsys.readouterr().out

    # Writes: one line naming the store and the reason.
    reason = f"the model store at {store_dir()} is not writable (Read-only file system)"
    assert main(["pull", f"{REPO}:Q2_K"]) == 1
    err = _one_line_error(capsys.readouterr().err, "pull")
    assert f"cannot download {REPO}/Tiny-Q2_K.gguf: {reason}" in err
    assert main(["pull", "gemma3-270m"]) == 1
    assert f"cannot download gemma3-270m: {reason}" in _one_line_error(
        capsys.readouterr().err, "pull")
    assert main(["rm", f"{REPO}:Q8_0"]) == 1
    assert f"cannot delete acme/Tiny-GGUF/Tiny-Q8_0.gguf: {reason}" in _one_line_error(
        capsys.readouterr().err, "rm")
    assert _store_files(tmp_path) == before


def test_read_only_store_for_real(hubsrv, tmp_path):
    """The same against a real read-only bind mount, where a user namespace allows one."""
    pull(f"{REPO}:Q8_0")
    models = tmp_path / "models"
    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount --bind {models} {models} && mount -o remount,bind,ro {models}"],
        capture_output=True)
    if not probe or probe.returncode != 0:
        pytest.skip("no user namespaces here to mount the store read-only")

    def pull_read_only(name):
        script = (f"mount --bind {models} {models} && mount -o remount,bind,ro {models} && "
                  f"exec {sys.executable} -m llamatui.app.cli pull {name}")
        return subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                               script], env=child_env(hubsrv, models), capture_output=True,
                              text=True, timeout=120)

    present = pull_read_only(f"{REPO}:Q8_0")
    assert present.returncode == 0, present.stderr
    assert present.stderr.strip() == f"{REPO}:Q8_0 is already in the store"
    missing = pull_read_only(f"{REPO}:Q2_K")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"llamatui pull: error: cannot download {REPO}/Tiny-Q2_K.gguf: the model store at "
        f"{models} is not writable (Read-only file system)")
