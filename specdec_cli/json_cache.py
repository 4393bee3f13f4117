"""The small JSON caches under $SPECDEC_HOME (decode costs, file hashes, vocabulary
fingerprints): read forgivingly, written atomically. Caching only saves time, so a missing,
damaged or unwritable cache is never an error."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks; writes stay atomic
    fcntl = None  # type: ignore[assignment]


def read_json_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_cache(path: Path, data: dict) -> None:
    with contextlib.suppress(OSError), replacing(path, "w") as out:
        out.write(json.dumps(data, indent=1))


@contextlib.contextmanager
def replacing(path: Path, mode: str) -> Iterator[IO]:
    """A file to write that replaces `path` once written whole: readers see the old file or
    the new one, never half of one, and the temporary name is this process's own, so two
    runs writing at once cannot mix their bytes. An error leaves `path` as it was."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, mode) as out:
            yield out
        os.replace(partial, path)
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


def update_json_cache(path: Path, change: Callable[[dict], None]) -> None:
    """Re-read the cache, let `change` edit it in place, write it back: all under a lock, so
    a key another process wrote between our read and our write is kept, not overwritten by
    our older copy of the file."""
    with locked(path):
        entries = read_json_cache(path)
        change(entries)
        write_json_cache(path, entries)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An advisory lock on `path`.lock; without one (no fcntl, an unwritable folder) the
    update goes ahead unlocked: a lost cache entry only costs a probe."""
    handle = None
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(f"{path.name}.lock"), "a")  # noqa: SIM115
    try:
        if handle is not None and fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        if handle is not None:
            handle.close()  # closing releases the lock
