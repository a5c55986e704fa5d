"""How the app writes numbers and facts: sizes, counts, durations and times, and the badges
that say whether a model fits this machine and whether the engine runs it. No widgets here."""
from __future__ import annotations

import time

from rich.text import Text

# A model's fit on this machine (models.recommend's Fit.kind), as the model manager and the
# hardware screen colour it.
FIT_STYLES = {"gpu": "bold green", "partial": "bold yellow", "ram": "green",
              "too_large": "bold red"}

# Whether the engine runs a repository or file (the catalog's answer; None: not known yet)
ENGINE_LABELS = {True: Text("runs", style="green"), False: Text("no", style="red"),
                 None: Text("?", style="dim")}


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def fmt_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def fmt_opt(n: int | None) -> str:
    """A count that may be unknown ("-")."""
    return "-" if n is None else fmt_count(n)


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def fmt_time(ts: float | None) -> str:
    """A moment to the minute, in local time; "never" for none."""
    if not ts:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def fit_badge(fit, recommended: bool = False) -> Text:
    """A Fit's label in its colour, starred when it is the recommended quantization."""
    badge = Text(fit.label, style=FIT_STYLES.get(fit.kind, ""))
    if recommended:
        badge.append("  ★ recommended", style="bold magenta")
    return badge
