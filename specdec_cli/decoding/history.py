"""Drafts from earlier prompts and answers: what the model wrote before, outside this prompt.

Shell loops, agents and chats repeat themselves across requests (the same JSON keys, the
same licence header, the same file rewritten in small steps). `HistoryIndex` keeps earlier
token sequences of one vocabulary and answers: where did the text's current ending occur
before, and what followed it there most often? The adaptive drafter weighs that continuation
against prompt lookup and the draft model. A history draft is only a proposal: the target
checks every token, so the answer is the same with or without history.

`HistoryFile` keeps an index on disk for `run` and `chat` (only with --history DIR): one
JSON line per document, appended in one write under a lock, so several runs at once (a
pipeline with `xargs -P 2`) neither mix their lines nor lose them; trimmed to the newest
documents atomically when it grows past twice its bound.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..json_cache import locked, replacing
from .drafters import NO_MATCH, NgramMatch

# A lookup keys on the text's last KEY_TOKENS tokens: shorter endings are mostly chance.
KEY_TOKENS = 4
# How far back a candidate's match is measured (its length decides how far it is trusted).
LONGEST_MATCH = 16
# Of many earlier occurrences of the key, the most recent ones looked at.
CANDIDATES = 32
# What an index holds by default: the newest documents up to this many tokens (about 4 MB
# of Python lists and 1 MB on disk per 100k tokens).
DEFAULT_HISTORY_TOKENS = 200_000
_SEPARATOR = -1  # between documents: no match or continuation crosses it


class HistoryIndex:
    """Earlier documents (token sequences), newest last, at most `max_tokens` tokens."""

    def __init__(self, max_tokens: int = DEFAULT_HISTORY_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._documents: deque[tuple[int, ...]] = deque()
        self._size = 0
        self._rebuild()

    def __len__(self) -> int:
        return len(self._documents)

    @property
    def tokens(self) -> int:
        return self._size

    def documents(self) -> list[tuple[int, ...]]:
        return list(self._documents)

    def add(self, document: Sequence[int]) -> None:
        """Remember a document; past the bound the oldest ones go first."""
        document = tuple(int(t) for t in document)[-self.max_tokens :]
        if not document:
            return
        self._documents.append(document)
        self._size += len(document)
        if self._size > self.max_tokens:
            while self._size > self.max_tokens * 3 // 4 and len(self._documents) > 1:
                self._size -= len(self._documents.popleft())
            self._rebuild()
        else:
            self._append(document)

    def lookup(self, context: Sequence[int], max_tokens: int) -> NgramMatch:
        """What most often followed the longest earlier matches of the context's ending
        (ties: the most recent). `length` is the match length in tokens. Only looks."""
        if len(context) < KEY_TOKENS or max_tokens <= 0:
            return NO_MATCH
        ends = self._ends.get(tuple(context[-KEY_TOKENS:]))
        if not ends:
            return NO_MATCH
        recent = ends[-CANDIDATES:]
        lengths = [self._match_length(context, end) for end in recent]
        longest = max(lengths)
        best = [end for end, n in zip(recent, lengths, strict=True) if n == longest]
        following = Counter(self._tokens[end + 1] for end in best)
        token = max(reversed(best), key=lambda end: following[self._tokens[end + 1]])
        return NgramMatch(self._continuation(token, max_tokens), longest, token)

    def _match_length(self, context: Sequence[int], end: int) -> int:
        n = KEY_TOKENS
        while (
            n < min(LONGEST_MATCH, len(context))
            and end - n >= 0
            and self._tokens[end - n] == context[-n - 1]
        ):
            n += 1
        return n

    def _continuation(self, end: int, max_tokens: int) -> tuple[int, ...]:
        following = []
        for token in self._tokens[end + 1 : end + 1 + max_tokens]:
            if token == _SEPARATOR:
                break
            following.append(token)
        return tuple(following)

    def _rebuild(self) -> None:
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for document in self._documents:
            self._append(document)

    def _append(self, document: tuple[int, ...]) -> None:
        start = len(self._tokens)
        self._tokens.extend(document)
        self._tokens.append(_SEPARATOR)  # every document ends in one: a continuation stops
        for end in range(start + KEY_TOKENS - 1, start + len(document)):
            self._ends.setdefault(tuple(self._tokens[end - KEY_TOKENS + 1 : end + 1]), []).append(
                end
            )


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
