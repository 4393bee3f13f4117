"""The small JSON caches under $SPECDEC_HOME (decode costs, file hashes, vocabulary
fingerprints): read forgivingly, written atomically. Caching only saves time, so a missing,
damaged or unwritable cache is never an error."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def read_json_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_cache(path: Path, data: dict) -> None:
    """Readers see the old file or the new one, never half of one; the temporary name is this
    process's own, so two runs writing at once cannot mix their bytes."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(data, indent=1))
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
