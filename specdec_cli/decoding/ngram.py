"""Where an ending of a growing token sequence occurred before, and what followed it there:
the common core of prompt lookup and Predicted Outputs (drafters.py, TokenScan) and history
(history.py, NgramTable). Which occurrence to draft from is each index's own choice."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

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


class TokenScan:
    """A growing token sequence, searched for the earlier occurrences of an ending by scanning
    it (numpy) from the ending's last token backwards. Prompt lookup matches up to 16 tokens:
    indexing every n-gram of 1 to 16 tokens (an NgramTable) cost 12 µs a token, 24 ms for a
    2,000-token prompt, six one-token steps of a 7B model on a GPU, paid before the second
    token. Appending costs nothing here, and one lookup scans the sequence once."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._array = np.empty(1024, dtype=np.int64)

    def extend(self, tokens: Sequence[int]) -> None:
        # numpy reads the tokens, and gives them back as Python ints: a 32,000-token prompt
        # in 0.9 ms, where converting each token with int() took 2.4 ms
        start, stop = len(self.tokens), len(self.tokens) + len(tokens)
        if stop > self._array.size:
            grown = np.empty(max(stop, 2 * self._array.size), dtype=np.int64)
            grown[:start] = self._array[:start]
            self._array = grown
        self._array[start:stop] = tokens
        self.tokens.extend(self._array[start:stop].tolist())

    def match_lengths(
        self, ending: Sequence[int], max_n: int, before: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every position before `before` where `ending`'s last token occurred (ascending),
        and for each how many of `ending`'s last tokens, at most `max_n`, end there."""
        tokens = self._array[:before]
        ends = np.flatnonzero(tokens == ending[-1])
        lengths = np.ones(ends.size, dtype=np.int64)
        alive = np.arange(ends.size)  # indexes into ends still matching
        for back in range(1, min(max_n, len(ending))):
            alive = alive[ends[alive] >= back]
            alive = alive[tokens[ends[alive] - back] == ending[-1 - back]]
            if alive.size == 0:
                break
            lengths[alive] += 1
        return ends, lengths

    def following(self, end: int, max_tokens: int) -> tuple[int, ...]:
        """Up to `max_tokens` tokens after position `end`."""
        return tuple(self.tokens[end + 1 : end + 1 + max_tokens])
