"""The chat app (Textual): `LlamaTUI` and its screens, one component per module."""
from .app import LlamaTUI, run_app

__all__ = ["LlamaTUI", "run_app"]
