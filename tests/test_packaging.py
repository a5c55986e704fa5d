"""The wheel holds every package folder: a sub-package missing from pyproject's list would install
without its files and fail only on a user's machine."""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP = {"app": "llamatui.app", "inference": "llamatui.inference", "models": "llamatui.models",
       "quantizer": "llamatui.quantizer"}


def _package_folders() -> set[str]:
    found = set()
    for folder, package in TOP.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((package, *rel.parts)))
    return found


def test_every_package_folder_is_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _package_folders()
    assert {k: v for k, v in config["package-dir"].items()} == {v: k for k, v in TOP.items()}


def test_package_data_covers_the_stylesheets():
    """Every folder holding stylesheets ships them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {sheet.parent for sheet in (ROOT / "app").rglob("*.tcss")}
    assert folders
    for folder in folders:
        package = ".".join(("llamatui.app", *folder.relative_to(ROOT / "app").parts))
        assert "*.tcss" in config["package-data"].get(package, []), package
