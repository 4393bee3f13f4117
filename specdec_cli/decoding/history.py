"""Drafts from earlier prompts and answers: what the model wrote before, outside this prompt.

Shell loops, agents and chats repeat themselves across requests (the same JSON keys, the
same licence header, the same file rewritten in small steps). `HistoryIndex` keeps earlier
token sequences of one vocabulary and answers: where did the text's current ending occur
before, and what followed it there most often? The adaptive drafter weighs that continuation
against prompt lookup and the draft model. A history draft is only a proposal: the target
checks every token, so the answer is the same with or without history.

On disk (`run` and `chat` with --history DIR) it is services/history_file.py's: this
module is pure.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from .backend import common_prefix_length
from .drafters import NO_MATCH, NgramMatch
from .ngram import NgramTable

# A lookup keys on the text's last KEY_TOKENS tokens: shorter endings are mostly chance.
KEY_TOKENS = 4
# How far back a candidate's match is measured (its length decides how far it is trusted).
LONGEST_MATCH = 16
# Of many earlier occurrences of the key, the most recent ones looked at.
CANDIDATES = 32
# What an index holds by default: the newest documents up to this many tokens (about 4 MB
# of Python lists and 1 MB on disk per 100k tokens).
DEFAULT_HISTORY_TOKENS = 200_000


class HistoryIndex:
    """Earlier documents (token sequences), newest last, at most `max_tokens` tokens."""

    def __init__(self, max_tokens: int = DEFAULT_HISTORY_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._documents: deque[tuple[int, ...]] = deque()
        self._size = 0
        self._last_turn: list[int] = []  # the prompt and answer add_turn saw last
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

    def add_turn(self, prompt: Sequence[int], answer: Sequence[int]) -> list[int]:
        """Remember a prompt and its answer, each part of a conversation once: what the
        prompt shares with the last turn remembered (a chat client resends the whole
        conversation; a new one may share its system message) is stored already, so only
        the rest and the answer are. Returns the document stored (for --history's file)."""
        prompt, answer = [int(t) for t in prompt], [int(t) for t in answer]
        document = [*prompt[common_prefix_length(prompt, self._last_turn) :], *answer]
        self.add(document)
        self._last_turn = [*prompt, *answer]
        return document

    def lookup(self, context: Sequence[int], max_tokens: int) -> NgramMatch:
        """What most often followed the longest earlier matches of the context's ending
        (ties: the most recent). `length` is the match length in tokens. Only looks.

        Safe beside one `add` in another thread (serve's slots share a key's history): it
        reads one table throughout (`add` may put a new one in place) and only n-grams
        whose next token is there already (`add` may be half-way through a document)."""
        if len(context) < KEY_TOKENS or max_tokens <= 0:
            return NO_MATCH
        table = self._table
        tokens = table.tokens
        whole = len(tokens) - 1
        recent = [end for end in table.ends(context[-KEY_TOKENS:])[-CANDIDATES:] if end < whole]
        if not recent:
            return NO_MATCH
        lengths = [_match_length(tokens, context, end) for end in recent]
        longest = max(lengths)
        best = [end for end, n in zip(recent, lengths, strict=True) if n == longest]
        following = Counter(tokens[end + 1] for end in best)
        token = max(reversed(best), key=lambda end: following[tokens[end + 1]])
        return NgramMatch(table.following(token, max_tokens), longest, token)

    def _rebuild(self) -> None:
        self._table = NgramTable(range(KEY_TOKENS, KEY_TOKENS + 1))
        for document in self._documents:
            self._append(document)

    def _append(self, document: tuple[int, ...]) -> None:
        self._table.extend(document)
        self._table.end_document()  # no match or continuation crosses into the next one


def _match_length(tokens: Sequence[int], context: Sequence[int], end: int) -> int:
    """How many tokens of the context's ending match the tokens ending at `end`."""
    n = KEY_TOKENS
    while (
        n < min(LONGEST_MATCH, len(context)) and end - n >= 0 and tokens[end - n] == context[-n - 1]
    ):
        n += 1
    return n
