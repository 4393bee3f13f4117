"""Where each n-gram of a growing token sequence ended, and what followed it there: the
common core of prompt lookup and Predicted Outputs (drafters.py) and history (history.py).
Which occurrence to draft from is each index's own choice."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SEPARATOR = -1  # between documents (never a token): no n-gram or continuation crosses it


class NgramTable:
    """A token sequence and, for each n in `sizes`, the positions where each of its n-grams
    ended (earliest first), kept in step as tokens are appended."""

    def __init__(self, sizes: range) -> None:
        self.sizes = sizes
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._start = 0  # where the current document began: no n-gram reaches before it

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n in self.sizes:
                if n > end + 1 - self._start:
                    break
                self._ends.setdefault(tuple(self.tokens[end - n + 1 :]), []).append(end)

    def end_document(self) -> None:
        """What is appended next is another document."""
        self.tokens.append(SEPARATOR)
        self._start = len(self.tokens)

    def ends(self, ngram: Sequence[int]) -> list[int]:
        """Where `ngram` ended, earliest first (its length one of `sizes`)."""
        return self._ends.get(tuple(ngram), [])

    def following(self, end: int, max_tokens: int) -> tuple[int, ...]:
        """Up to `max_tokens` tokens after position `end`, within its document."""
        tokens = self.tokens[end + 1 : end + 1 + max_tokens]
        return tuple(tokens[: tokens.index(SEPARATOR)] if SEPARATOR in tokens else tokens)
