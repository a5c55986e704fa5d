"""The keys that open the app's screens, the same on every screen.

One table drives the app's bindings, the footers that show some of them, the command palette and
the help screen, so that F5 is Downloads wherever it is pressed and the three cannot disagree.
The chat screen's own keys are in chat/actions.py (CHAT_ACTIONS); a screen's local keys in its
table.
"""
from __future__ import annotations

from textual.binding import Binding

# (key, action on the app, footer label, palette/help title, what it does). The model manager's
# tabs follow the keys' order: Local (F3), Downloads (F5), Search (F6), Files (F7).
APP_ACTIONS = [
    ("f3", "model_manager('local')", "Models", "Model manager",
     "the model manager, on its tab of local models"),
    ("f4", "hardware", "Hardware", "Hardware",
     "this machine's RAM, CPU, GPUs, disk and what it can run"),
    ("f5", "model_manager('downloads')", "Downloads", "Downloads", "downloads in progress"),
    ("f6", "model_manager('search')", "Search", "Search the Hub",
     "find GGUF repositories on Hugging Face"),
    ("f7", "model_manager('files')", "Files", "Repository files",
     "the open repository's files by quantization, with fit badges"),
    ("f12", "server", "Server", "Server", "serve the chat's model as an OpenAI-compatible API"),
]


def key_label(key: str) -> str:
    """How help and the palette write a key: F5, Esc, ctrl+s."""
    return {"escape": "Esc", "enter": "Enter"}.get(key, key.upper() if key[:1] == "f" and
                                                   key[1:].isdigit() else key)


def app_bindings() -> list[Binding]:
    """The app's bindings: shown in no footer by themselves, and priority bindings so that they
    work on every screen, dialogs included (a modal screen hides the app's other bindings)."""
    return [Binding(key, action, label, show=False, priority=True)
            for key, action, label, _, _ in APP_ACTIONS]


def footer_bindings(*keys: str) -> list[Binding]:
    """Bindings a screen adds to show some of the app's keys in its footer (same key, same
    action, same label as everywhere else; priority like the app's, or the app's would hide
    them)."""
    return [Binding(key, f"app.{action}", label, show=True, priority=True)
            for key, action, label, _, _ in APP_ACTIONS if key in keys]


def manager_tab_key(tab: str) -> str:
    """The key that opens a tab of the model manager ("F5" for "downloads")."""
    return next(key_label(key) for key, action, _, _, _ in APP_ACTIONS
                if action == f"model_manager('{tab}')")
