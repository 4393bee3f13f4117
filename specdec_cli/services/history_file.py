"""--history DIR on disk, for `run` and `chat`: one JSON line per document, appended in one
write under a lock, so several runs at once (a pipeline with `xargs -P 2`) neither mix
their lines nor lose them; trimmed to the newest documents atomically when it grows past
twice its bound. What is drafted from it is decoding/history.py's HistoryIndex."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..decoding.history import DEFAULT_HISTORY_TOKENS, HistoryIndex
from ..json_cache import locked, replacing


@dataclass(frozen=True)
class HistoryFile:
    """An index's documents on disk: `folder`/`vocabulary`.jsonl, one {"tokens": [...]} line
    per document. Token ids mean the same text for every model of one vocabulary, so models
    that share a vocabulary (quantisations of one model) share a history."""

    folder: Path
    vocabulary: str
    max_tokens: int = DEFAULT_HISTORY_TOKENS

    @property
    def path(self) -> Path:
        return self.folder / f"{self.vocabulary}.jsonl"

    def load(self) -> tuple[HistoryIndex, int]:
        """The index of the file's newest documents, and how many lines were unreadable
        (skipped: a damaged line is never trusted, and costs only its drafts)."""
        documents, damaged = self.read()
        index = HistoryIndex(self.max_tokens)
        for document in _newest(documents, self.max_tokens):
            index.add(document)
        return index, damaged

    def read(self) -> tuple[list[list[int]], int]:
        """Every readable document in the file, oldest first, and how many lines were not."""
        documents, damaged = [], 0
        for document in self._read():
            if document is None:
                damaged += 1
            elif document:
                documents.append(document)
        return documents, damaged

    def append(self, document: Sequence[int]) -> str | None:
        """Add one document: a single appended line under the file's lock; past twice the
        bound, the file is rewritten with its newest documents (atomically). What went
        wrong (an unwritable folder), or None."""
        if not document:
            return None
        line = _line(document)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with locked(self.path):
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(line)
                if self._stored_tokens() > 2 * self.max_tokens:
                    self._trim()
        except OSError as error:
            return f"cannot write {self.path}: {error.strerror or error}"
        return None

    def clear(self) -> None:
        with locked(self.path):
            self.path.unlink(missing_ok=True)

    def _read(self) -> Iterator[list[int] | None]:
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return
        for line in lines:
            yield _document(line)

    def _stored_tokens(self) -> int:
        # A line holds about this many bytes per token (ids up to six digits and a comma).
        with contextlib.suppress(OSError):
            return self.path.stat().st_size // 6
        return 0

    def _trim(self) -> None:
        index, _ = self.load()
        with replacing(self.path, "w") as out:
            out.writelines(_line(document) for document in index.documents())


def _newest(documents: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The newest documents that fit in `max_tokens` together (at least the newest one),
    oldest first: what an index keeps, found without indexing the others first."""
    kept, size = 0, 0
    for document in reversed(documents):
        if kept and size + len(document) > max_tokens:
            break
        kept, size = kept + 1, size + len(document)
    return documents[len(documents) - kept :]


def _line(document: Sequence[int]) -> str:
    return json.dumps({"tokens": [int(t) for t in document]}, separators=(",", ":")) + "\n"


def _document(line: str) -> list[int] | None:
    try:
        tokens = json.loads(line)["tokens"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        return None
    return tokens


@dataclass(frozen=True)
class HistorySummary:
    """What one history file holds (`specdec history`)."""

    path: Path
    documents: int
    tokens: int
    damaged: int
    bytes: int


def summarize(folder: Path) -> list[HistorySummary]:
    """Every history file in a folder: what it holds, read as a run reads it."""
    summaries = []
    for file in _files(folder):
        documents, damaged = file.read()
        tokens = sum(len(document) for document in documents)
        summaries.append(
            HistorySummary(file.path, len(documents), tokens, damaged, file.path.stat().st_size)
        )
    return summaries


def clear(folder: Path) -> int:
    """Delete every history file in a folder; how many there were."""
    files = _files(folder)
    for file in files:
        file.clear()
    return len(files)


def _files(folder: Path) -> list[HistoryFile]:
    paths = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    return [HistoryFile(folder, path.stem) for path in paths]
