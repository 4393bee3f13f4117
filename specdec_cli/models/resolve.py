"""Names -> files: what run, chat, bench and pull call with a --draft/--target value.

A value that looks like a path is used as-is; a registry name or alias is looked up and
fetched (fetch.py) unless already present. Without --draft, pick_drafter chooses the smallest
registry model that shares the target's vocabulary (vocab.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import IncompatibleModelsError, ModelFileError
from .fetch import fetch_entry
from .fetch_progress import FetchProgress
from .gguf_meta import read_gguf_info
from .registry import ModelEntry, Registry, load_registry
from .vocab import FINGERPRINT_CHARS, entry_fingerprint, fingerprints


def looks_like_path(spec: str) -> bool:
    """A --draft/--target value that names a file rather than a registry entry."""
    return spec.endswith(".gguf") or os.sep in spec or "/" in spec or Path(spec).is_file()


def check_local_model(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelFileError(
            f"Model file {path} does not exist.",
            "Check the path, or give a registry name (see `specdec models`).",
        )
    return path


@dataclass(frozen=True)
class ResolvedModel:
    """A --draft/--target value turned into a file on disk."""

    path: Path
    name: str  # the registry name, or the file name for a path given as-is
    entry: ModelEntry | None = None  # None for a path given as-is


def resolve_model(
    spec: str,
    *,
    models_file: Path | None = None,
    offline: bool = False,
    progress: FetchProgress | None = None,
    registry: Registry | None = None,
) -> ResolvedModel:
    """Turn a --draft/--target value (registry name, alias, or path) into a local file.

    A path (anything ending in .gguf, containing a slash, or naming an existing file) is used
    as-is. A name is looked up in the registry (packaged models.yaml merged with `models_file`
    or the user's file) and fetched with progress unless already present; with `offline` (or
    HF_HUB_OFFLINE) a missing file is an error instead. Raises RegistryError for unknown names
    (with the closest matches), FetchError/ChecksumError when no source delivers a good file,
    ModelFileError for a path that does not exist.
    """
    if looks_like_path(spec):
        path = check_local_model(spec)
        return ResolvedModel(path=path, name=path.name)
    registry = registry or load_registry(models_file)
    entry = registry.lookup(spec)
    return ResolvedModel(fetch_entry(entry, offline=offline, progress=progress), entry.name, entry)


def pick_drafter(
    target: ResolvedModel,
    *,
    models_file: Path | None = None,
    offline: bool = False,
    progress: FetchProgress | None = None,
    registry: Registry | None = None,
) -> ResolvedModel:
    """The smallest registry model, smaller than `target`, that shares its vocabulary.

    Used for `--target X` without `--draft`; the caller should say which drafter was picked
    (`.name`). The choice is fetched like resolve_model does. Raises IncompatibleModelsError
    when no registry model fits.
    """
    registry = registry or load_registry(models_file)
    wanted = fingerprints().fingerprint(target.path)[:FINGERPRINT_CHARS]
    target_size = _param_count(target)
    candidates = [
        entry
        for entry in registry.models.values()
        if entry.name != target.name
        and entry.param_count < target_size
        and entry_fingerprint(entry) == wanted
    ]
    if not candidates:
        raise IncompatibleModelsError(
            f"No model in the registry is smaller than '{target.name}' and shares its vocabulary.",
            "Pass --draft NAME or --draft PATH.gguf with a drafter of the same tokenizer.",
        )
    best = min(candidates, key=lambda e: (e.param_count, e.size or 0))
    return resolve_model(best.name, offline=offline, progress=progress, registry=registry)


def _param_count(model: ResolvedModel) -> float:
    if model.entry is not None:
        return model.entry.param_count
    return float(read_gguf_info(model.path).parameter_count)


def pull(
    names: list[str],
    *,
    models_file: Path | None = None,
    progress: FetchProgress | None = None,
) -> list[ResolvedModel]:
    """Fetch and verify each named model (default: the registry's default pair)."""
    registry = load_registry(models_file)
    names = names or [registry.default_draft, registry.default_target]
    return [resolve_model(n, progress=progress, registry=registry) for n in names]
