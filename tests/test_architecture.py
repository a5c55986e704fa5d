"""The package's layers hold: import-linter's contracts in pyproject.toml (app on top, the model
manager and the quantizer below it, the engine at the bottom; the app on the engine's public
API; the CPU and CUDA backends independent; families on the backend interface only), and every
public name of the engine resolves."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import llamatui.inference as engine_api

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("app", "inference", "models", "quantizer")


def test_import_contracts_hold(tmp_path):
    lint_imports = shutil.which("lint-imports")
    if lint_imports is None:
        pytest.fail("import-linter is a dev dependency: pip install -e '.[dev]'")
    # import-linter reads a package from where Python finds it; the editable install maps
    # llamatui.* onto the top-level folders through an import hook it cannot walk, so the check
    # runs on a `llamatui` folder of links to them.
    package = tmp_path / "llamatui"
    package.mkdir()
    for name in PACKAGES:
        (package / name).symlink_to(ROOT / name, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(tmp_path), os.environ.get("PYTHONPATH"))))}
    run = subprocess.run([lint_imports, "--no-cache", str(ROOT / "pyproject.toml")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout and " kept" in run.stdout, run.stdout


def test_contracts_see_every_module(tmp_path):
    """A contract over a package import-linter cannot find would pass vacuously."""
    sys.path.insert(0, str(tmp_path))
    try:
        package = tmp_path / "llamatui"
        package.mkdir()
        for name in PACKAGES:
            (package / name).symlink_to(ROOT / name, target_is_directory=True)
        import grimp
        graph = grimp.build_graph(*(f"llamatui.{name}" for name in PACKAGES), cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    files = [p for name in PACKAGES for p in (ROOT / name).rglob("*.py")]
    assert len(graph.modules) == len(files)
    assert "llamatui.inference.cpu.matmul" in graph.modules


def test_every_public_name_resolves():
    for name in engine_api.__all__:
        assert getattr(engine_api, name) is not None, name
    assert set(dir(engine_api)) >= set(engine_api.__all__)
