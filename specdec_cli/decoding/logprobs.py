"""Emitted tokens' log-probabilities (OpenAI's `logprobs`): each under the target's raw
distribution at its position, the log-softmax of the logits the target computed there,
before temperature, top-k/top-p/min-p and any grammar. In exact mode those logits are the
target alone's, bit for bit, so a drafter changes no log-probability either."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's most alternatives a token (chat completions' top_logprobs)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability and the `top` most likely tokens at its position with
    theirs, most likely first (ties by token id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """`token`'s log-probability in the logit row `row`, and the row's `n_top` best."""
    peak = float(row.max())
    # float64 sum: 152k terms in float32 would lose the small ones' share
    log_total = peak + float(np.log(np.exp(row - peak).sum(dtype=np.float64)))
    best = _best(row, n_top)
    top = tuple((int(t), float(row[t]) - log_total) for t in best)
    return TokenLogprob(token, float(row[token]) - log_total, top)


def _best(row: np.ndarray, n: int) -> np.ndarray:
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    n = min(n, len(row))
    candidates = np.argpartition(-row, n - 1)[:n]
    return candidates[np.lexsort((candidates, -row[candidates]))]
