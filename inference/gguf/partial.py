"""Partial files: GGUFWriter assembles a file as `.<name>.partial-<pid>-<random>` beside it and
holds an exclusive flock on it while writing. A writer killed with -9 loses the lock, so the next
writer in that folder (or the model store, which lists these) can tell its leftover from a file
still being written, and remove it."""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; partials are judged by age
    fcntl = None

_PARTIAL_WRITE = re.compile(r"^\.(?P<target>.+)\.partial-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_OLD_PARTIAL_WRITE = re.compile(r"^\.partial-[A-Za-z0-9_]+\.gguf$")  # before pids and locks
# Without a lock to ask: a partial untouched this long has no writer (one writes continuously).
ABANDONED_AFTER = 60.0
OLD_ABANDONED_AFTER = 3600.0


@dataclass(frozen=True)
class PartialWrite:
    """A file GGUFWriter is writing, or a leftover of one that died (`abandoned`)."""
    path: str
    target: str | None  # the file it becomes (None for the older unnamed partials)
    pid: int | None
    size: int
    abandoned: bool


def _process_exists(pid: int) -> bool:
    """POSIX only (on Windows os.kill would end the process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _locked_by_writer(path: str) -> bool:
    """Whether a live writer holds the partial's flock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held
        return True
    finally:
        os.close(fd)  # releases the shared lock if we got it
    return False


def _abandoned(path: str, pid: int | None, mtime: float) -> bool:
    age = time.time() - mtime
    if pid is None:
        return age > OLD_ABANDONED_AFTER
    if fcntl is None:
        return age > ABANDONED_AFTER
    if _locked_by_writer(path):
        return False
    # Unlocked: dead, or between creating the file and locking it (its process alive, the
    # file new), or its pid reused by another process (the file old).
    return not _process_exists(pid) or age > ABANDONED_AFTER


def partial_writes(directory) -> list[PartialWrite]:
    """GGUFWriter's partial files in `directory`, live and abandoned."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return out
    for e in entries:
        m = _PARTIAL_WRITE.match(e.name)
        if m is None and not _OLD_PARTIAL_WRITE.match(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        pid = int(m["pid"]) if m else None
        target = os.path.join(directory, m["target"]) if m else None
        out.append(PartialWrite(e.path, target, pid, st.st_size,
                                _abandoned(e.path, pid, st.st_mtime)))
    return sorted(out, key=lambda p: p.path)


def remove_abandoned_writes(directory) -> list[PartialWrite]:
    """Deletes the partial files in `directory` whose writer died; returns them. Never
    raises: a folder that cannot be written keeps its leftovers."""
    removed = []
    for p in partial_writes(directory):
        if p.abandoned:
            try:
                os.unlink(p.path)
                removed.append(p)
            except OSError:
                pass
    return removed
