"""A prompt cache on disk (`specdec run --prompt-cache DIR`): the models' KV state after a
prompt, so a later prompt that starts the same way skips most of its prefill.

Each entry is one file: a JSON header line (format, key, the prompt's tokens, the size and
SHA-256 of each state) and then the states, llama.cpp's own bytes for the target and the
drafter. The key names everything the state depends on (each model file's SHA-256, the
kernel configuration, the threads), so a state is only ever restored into the models and
kernels that computed it. In exact mode only whole prompt chunks are saved (see
LlamaBackend.reusable_prompt): a restored prefix is then bit for bit what a fresh prefill
computes, and the answer does not depend on the cache. A damaged or foreign file is skipped
with one warning, never trusted; the folder is kept under a size bound, least recently used
first out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..decoding.backend import kept_prefix
from ..json_cache import replacing

if TYPE_CHECKING:
    from ..models.loading import ModelPair
    from ..request import HardwareOptions

FORMAT = "specdec.prompt-cache/1"
# A cached prefix shorter than this is not worth reading a file for.
MIN_REUSE = 64
DEFAULT_CACHE_BYTES = 4 * 1024**3
_HEADER_LIMIT = 64 * 1024 * 1024  # a header line longer than this is not one of ours


@runtime_checkable
class StatefulBackend(Protocol):
    """What the cache needs of a backend (LlamaBackend has it)."""

    cached: list[int]

    def reusable_prefix(self, shared: int) -> int: ...

    def truncate(self, n_keep: int) -> None: ...

    @property
    def reusable_prompt(self) -> int: ...

    def save_state(self, n_tokens: int) -> bytes: ...

    def restore_state(self, state: bytes, tokens: Sequence[int]) -> bool: ...


@dataclass(frozen=True)
class Entry:
    path: Path
    tokens: tuple[int, ...]


class PromptCache:
    """The entries of one key (models and kernels) in `folder`."""

    def __init__(self, folder: Path, key: str, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.folder, self.key, self.max_bytes = folder, key, max_bytes
        self.skipped: list[Path] = []  # damaged or foreign files met while looking
        self.problem: str | None = None  # why the last store failed

    def best(self, prompt: Sequence[int], target: StatefulBackend) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with `prompt` that `target` would keep (short
        of the prompt's last token, which must be decoded for its logits), and its length."""
        found, longest = None, 0
        for entry in self._entries():
            shared = target.reusable_prefix(kept_prefix(entry.tokens, prompt, 1))
            if shared > longest:
                found, longest = entry, shared
        return (found, longest) if found is not None and longest >= MIN_REUSE else None

    def restore(
        self, entry: Entry, target: StatefulBackend, drafter: StatefulBackend | None
    ) -> bool:
        """Load the entry's states (the drafter's too, where the entry has one); False, with
        both caches empty and the file counted as skipped, if it is damaged or refused."""
        states = self._read_states(entry.path)
        restored = states is not None and target.restore_state(states["target"], entry.tokens)
        if restored and drafter is not None and states is not None and "drafter" in states:
            restored = drafter.restore_state(states["drafter"], entry.tokens)
        if not restored:
            self.skipped.append(entry.path)
            for backend in (target, drafter):
                if backend is not None:
                    backend.truncate(0)
            return False
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # recently used: evicted last
        return True

    def store(
        self, prompt: Sequence[int], target: StatefulBackend, drafter: StatefulBackend | None
    ) -> Path | None:
        """Save the models' states for the prompt's reusable prefix (drops everything after
        it from their caches). None when there is nothing worth saving."""
        n = min(len(prompt), target.reusable_prompt)
        tokens = [int(t) for t in prompt[:n]]
        if n < MIN_REUSE or target.cached[:n] != tokens:
            return None
        states = {"target": target.save_state(n)}
        if drafter is not None and drafter.cached[:n] == tokens:  # it decoded the prompt
            states["drafter"] = drafter.save_state(n)
        path = self.folder / f"{self.key[:16]}-{_digest(tokens)[:16]}.state"
        try:
            with replacing(path, "wb") as out:
                out.write(self._header(tokens, states) + b"\n")
                out.writelines(states.values())
        except OSError as error:  # an unwritable folder, a full disk: the answer stands
            self.problem = f"cannot write {path}: {error.strerror or error}"
            return None
        self._evict(keep=path)
        return path

    # -- files ------------------------------------------------------------------------------

    def _header(self, tokens: list[int], states: dict[str, bytes]) -> bytes:
        parts = {name: {"bytes": len(s), "sha256": _sha256(s)} for name, s in states.items()}
        record = {"format": FORMAT, "key": self.key, "tokens": tokens, "states": parts}
        return json.dumps(record, separators=(",", ":")).encode()

    def _entries(self) -> Iterator[Entry]:
        for path in sorted(self.folder.glob("*.state")) if self.folder.is_dir() else []:
            header = _read_header(path)
            if header is None:
                self.skipped.append(path)
            elif header["key"] == self.key:
                yield Entry(path, tuple(header["tokens"]))

    def _read_states(self, path: Path) -> dict[str, bytes] | None:
        try:
            with open(path, "rb") as f:
                header = _parse_header(f.readline(_HEADER_LIMIT))
                if header is None or header["key"] != self.key:
                    return None
                states = {}
                for name, part in header["states"].items():
                    data = f.read(part["bytes"])
                    if len(data) != part["bytes"] or _sha256(data) != part["sha256"]:
                        return None
                    states[name] = data
                return states if "target" in states else None
        except (OSError, KeyError, TypeError, AttributeError):
            return None

    def _evict(self, keep: Path) -> None:
        """Least recently used first, until the folder's states fit the bound."""
        files = []
        for path in self.folder.glob("*.state"):
            with contextlib.suppress(OSError):
                stat = path.stat()
                files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            if path != keep:
                with contextlib.suppress(OSError):
                    path.unlink()
                    total -= size


def _read_header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            return _parse_header(f.readline(_HEADER_LIMIT))
    except OSError:
        return None


def _parse_header(line: bytes) -> dict | None:
    try:
        header = json.loads(line)
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None
    tokens, states = header.get("tokens"), header.get("states")
    if (
        not isinstance(header.get("key"), str)
        or not isinstance(tokens, list)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)
        or not isinstance(states, dict)
    ):
        return None
    return header


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(tokens: list[int]) -> str:
    return _sha256(json.dumps(tokens).encode())


def prompt_cache_key(pair: ModelPair, hardware: HardwareOptions) -> str:
    """What a saved KV state depends on: each model file's content, the kernels (exact or
    fast, and the build), threads and GPU layers."""
    from ..llama import library
    from ..models.checksums import cached_sha256

    files = [cached_sha256(b.path) if b and b.path else "-" for b in (pair.target, pair.drafter)]
    setup = f"{hardware.placement()}:{library.kernel_signature(hardware.exact)}"
    return hashlib.sha256("|".join([*files, setup]).encode()).hexdigest()
