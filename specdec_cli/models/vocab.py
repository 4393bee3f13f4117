"""Vocabulary fingerprints of registry models: which models can draft for which.

Two models share a vocabulary when their fingerprint prefixes match. A downloaded model's
fingerprint is computed from its file (cached); one not yet downloaded uses the registry's
`vocab:` value. pick_drafter (resolve.py) and the `specdec models` listing (model_status.py)
both ask here.
"""

from __future__ import annotations

from ..errors import ModelFileError
from ..paths import cache_dir
from .fetch import find_local
from .gguf_meta import FingerprintCache
from .registry import ModelEntry

FINGERPRINT_CHARS = 16  # registry `vocab:` values and listings use this prefix


def fingerprints() -> FingerprintCache:
    return FingerprintCache(cache_dir() / "vocab-fingerprints.json")


def entry_fingerprint(entry: ModelEntry) -> str | None:
    """The vocabulary fingerprint prefix: computed from the local file, else the registry's."""
    local = find_local(entry)
    if local is not None:
        try:
            return fingerprints().fingerprint(local)[:FINGERPRINT_CHARS]
        except ModelFileError:
            return None
    return entry.vocab[:FINGERPRINT_CHARS] if entry.vocab else None
