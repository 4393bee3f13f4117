"""What OpenAI's API changes in the target's logits before a token is chosen: the frequency
and presence penalties, each logit lowered by how often its token already came in the answer
(`frequency` a time) and by whether it came at all (`presence`), counting the answer's own
tokens, not the prompt's (as OpenAI and vLLM count them); and `logit_bias`, a fixed amount
added to chosen tokens' logits in every row.

A verification's row i comes after the answer so far and the draft's first i tokens, so its
counts are the answer's plus those: each row is penalised as the target alone would
penalise it at that position, and the answer stays the target alone's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's: -100 bans a token, 100 all but forces it


@dataclass(frozen=True)
class Penalties:
    frequency: float = 0.0
    presence: float = 0.0

    def __bool__(self) -> bool:
        return self.frequency != 0.0 or self.presence != 0.0

    def rows(self, rows: np.ndarray, answered: Counter[int], draft: Sequence[int]) -> np.ndarray:
        """A penalised copy of a verification's `rows`: row i after the tokens counted in
        `answered` and the draft's first i."""
        counts = Counter(answered)
        penalised = np.array(rows, dtype=np.float32)
        for i, row in enumerate(penalised):
            self._lower(row, counts)
            if i < len(draft):
                counts[draft[i]] += 1
        return penalised

    def _lower(self, row: np.ndarray, counts: Counter[int]) -> None:
        if not counts:
            return
        tokens = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        times = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        row[tokens] -= np.float32(self.frequency) * times + np.float32(self.presence)


def biased(rows: np.ndarray, bias: Sequence[tuple[int, float]]) -> np.ndarray:
    """`rows` with each (token, amount) of `bias` added to the token's logit in every row (in
    place where the rows are already a copy of their own)."""
    tokens = np.array([token for token, _ in bias], dtype=np.int64)
    amounts = np.array([amount for _, amount in bias], dtype=np.float32)
    rows[:, tokens] += amounts
    return rows
