"""Hugging Face Hub source: a registry entry's file from the hub's own cache, or downloaded.

Files stay in the hub's cache (HF_HUB_CACHE), read at each call rather than at import. A
download first probes the hub once without retries, so an unreachable hub fails fast and the
next source is tried; a fresh file that fails its size/SHA-256 check is deleted with its
snapshot link.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..errors import ChecksumError, FetchError
from .checksums import verify_download
from .fetch_progress import FetchProgress
from .registry import HubSource, ModelEntry


def _hub_cache_dir() -> str | None:
    # Read at call time: huggingface_hub reads its environment once, at import.
    return os.environ.get("HF_HUB_CACHE") or None


def _hub_endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def hub_cached(source: HubSource) -> Path | None:
    """The source's file if the hub cache already has it; never touches the network."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = hf_hub_download(
            source.repo,
            source.file,
            revision=source.revision,
            cache_dir=_hub_cache_dir(),
            local_files_only=True,
        )
    except (LocalEntryNotFoundError, OSError):
        return None
    return Path(path)


def hub_download(entry: ModelEntry, source: HubSource, progress: FetchProgress) -> Path:
    """Download `entry`'s file from the hub into its cache, verified; FetchError if it fails."""
    from huggingface_hub import hf_hub_download

    _probe_hub(source)
    progress.start(f"{entry.name} (hub)", entry.size)
    try:
        path = Path(
            # tqdm_class is typed as a class, but any callable that returns a bar will do.
            hf_hub_download(  # type: ignore[call-overload]
                source.repo,
                source.file,
                revision=source.revision,
                cache_dir=_hub_cache_dir(),
                endpoint=_hub_endpoint(),
                tqdm_class=functools.partial(_HubBar, progress),
            )
        )
    except Exception as e:  # the hub raises many kinds; all mean "this source failed"
        raise FetchError(
            f"Hub download of {source.repo}/{source.file} failed: {e}",
            "Check HF_ENDPOINT, HF_TOKEN and your network.",
        ) from e
    finally:
        progress.finish()
    _verify_hub_file(entry, path)
    return path


def _probe_hub(source: HubSource) -> None:
    """One HEAD request without retries, so an unreachable hub fails in milliseconds.

    hf_hub_download retries for about 20 s when the hub cannot be reached; where only a PyPI
    mirror is reachable, the next source should be tried at once instead.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=_hub_endpoint())
    try:
        get_hf_file_metadata(url, endpoint=_hub_endpoint(), retry_on_errors=False)
    except Exception as e:
        raise FetchError(
            f"Hugging Face Hub is not reachable for {source.repo} ({e})",
            "Set HF_ENDPOINT to a reachable mirror or use another source.",
        ) from e


def _verify_hub_file(entry: ModelEntry, pointer: Path) -> None:
    """Check a fresh hub download; on mismatch delete both the blob and the snapshot link."""
    blob = pointer.resolve()
    try:
        verify_download(entry, blob)
    except ChecksumError:
        pointer.unlink(missing_ok=True)
        raise


class _HubBar:
    """Just enough of tqdm for huggingface_hub's downloader to report bytes to FetchProgress."""

    def __init__(self, progress: FetchProgress, *, initial: int = 0, **_: object) -> None:
        self.progress = progress
        if initial:
            progress.advance(initial)

    def update(self, n: int | None = 1) -> None:
        self.progress.advance(n or 0)

    def close(self) -> None:
        pass

    def __enter__(self) -> _HubBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
