"""SHA-256 of model files, and the check a downloaded file must pass before it is used.

`verify_download` compares a fresh file's size and SHA-256 with its registry entry and deletes
it on a mismatch, so a bad download never passes as complete later. `cached_sha256` hashes a
model once, not per run, for the caches keyed by a file's content (prompt cache, bench reports).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import ChecksumError
from ..json_cache import read_json_cache, write_json_cache
from ..paths import cache_dir
from .registry import ModelEntry

CHUNK = 1 << 20  # bytes read at a time when hashing or copying a model file


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def cached_sha256(path: Path, cache_file: Path | None = None) -> str:
    """SHA-256 of a file, cached by (path, size, mtime): a model is hashed once, not per run."""
    cache_file = cache_file or cache_dir() / "sha256.json"
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    known = read_json_cache(cache_file)
    if key not in known:
        known[key] = sha256_of(path)
        write_json_cache(cache_file, known)
    return known[key]


def verify_download(entry: ModelEntry, path: Path, actual_sha: str | None = None) -> None:
    """Raise ChecksumError (after deleting `path`) unless size and SHA-256 match the entry."""
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        problem = f"has {size} bytes, expected {entry.size}"
    elif entry.sha256 is not None and (actual := actual_sha or sha256_of(path)) != entry.sha256:
        problem = f"has SHA-256 {actual}, expected {entry.sha256}"
    else:
        return
    path.unlink(missing_ok=True)
    raise ChecksumError(
        f"Downloaded file for '{entry.name}' {problem}; the bad file was deleted.",
        "Retry `specdec pull`; if it fails again, the source or the registry entry is wrong.",
    )
