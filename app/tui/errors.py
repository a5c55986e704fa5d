"""What the user is told when something fails: a title and a message for a dialog or a
notification, never a traceback."""
from __future__ import annotations

import pathlib

from llamatui.models import download as model_download
from llamatui.models import hub as model_hub
from llamatui.models import store as model_store

from ..conversations import OutputFormatError


def describe_error(error: BaseException, path: str | None = None) -> tuple[str, str]:
    """(title, message) for an error of the chat: loading `path` or generating from it."""
    # The engine's errors, by its public names; imported here, when one has happened, so that
    # the app starts without loading the engine's modules.
    from llamatui.inference import ChatTemplateError, ConstraintError, ContextFullError, GGUFError
    name = pathlib.Path(path).name if path else "the model"
    if isinstance(error, FileNotFoundError):
        return "Model file missing", f"{path or error.filename}: no such file."
    if isinstance(error, GGUFError):
        text = str(error)
        return "Not a usable GGUF model", text if name in text else f"{name}: {text}"
    if isinstance(error, MemoryError):
        return "Out of memory", (f"{name} does not fit in memory with this context size. "
                                 "Lower the context size (ctrl+s) or pick a smaller model.")
    if isinstance(error, ContextFullError):
        return "Context full", (f"{error}. Start a new chat (ctrl+n) or raise the context "
                                "size in the settings (ctrl+s).")
    if isinstance(error, PermissionError):
        return "Permission denied", str(error)
    if isinstance(error, ChatTemplateError):
        return "Chat template failed", (f"{name}: {error}. The model's own chat template "
                                        "could not turn this chat into a prompt.")
    if isinstance(error, (OutputFormatError, ConstraintError)):
        return "JSON output setting", (f"{error}. Change or clear JSON output in the chat "
                                       "settings (ctrl+s).")
    return type(error).__name__, str(error) or type(error).__name__


def fails_every_reply(error: BaseException) -> bool:
    """Whether a reply's error will come back on every reply of this model (a chat template
    that cannot render): worth a dialog rather than a notification."""
    from llamatui.inference import ChatTemplateError
    return isinstance(error, ChatTemplateError)


def describe_hub_error(error: BaseException, what: str) -> tuple[str, str, str]:
    """(title, message, severity) of a notification for a failed Hub or store call."""
    text = str(error) or type(error).__name__
    if isinstance(error, model_download.DownloadCancelled):
        return f"Cancelled: {what}", text, "warning"
    if isinstance(error, model_hub.RepoNotFoundError):
        return "Not found", text, "error"
    if isinstance(error, model_hub.GatedRepoError):
        return "Gated repository", f"{text} (accept its terms on huggingface.co and set "\
            "HF_TOKEN)", "error"
    if isinstance(error, model_hub.EntryNotFoundError):
        return "File not found", text, "error"
    if isinstance(error, model_hub.HubUnreachableError):
        return "Hub unreachable (offline?)", text, "error"
    if isinstance(error, model_hub.HubError):
        return f"Hub error: {what}", text, "error"
    if isinstance(error, model_store.StoreError):
        return f"Store error: {what}", text, "error"
    if isinstance(error, ValueError):
        return f"Invalid: {what}", text, "error"
    return f"Failed: {what}", f"{type(error).__name__}: {text}", "error"
