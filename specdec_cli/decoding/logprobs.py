"""Emitted tokens' log-probabilities (OpenAI's `logprobs`): each under the target's raw
distribution at its position, the log-softmax of the logits the target computed there,
before temperature, top-k/top-p/min-p and any grammar. In exact mode those logits are the
target alone's, bit for bit, so a drafter changes no log-probability either."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's most alternatives a token (chat completions' top_logprobs)
# The alternatives are sought first among logits this close to the row's highest (a model's
# 20 likeliest tokens are mostly within it), the margin widened 4x until there are enough,
# and the whole row taken past TOP_MARGIN_LIMIT; more than TOP_SORTED candidates (a flat
# row) are partitioned before they are sorted.
TOP_MARGIN = 2.0
TOP_MARGIN_LIMIT = 1e4
TOP_SORTED = 1024


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
    best = _best(row, n_top, peak)
    top = tuple((int(t), float(row[t]) - log_total) for t in best)
    return TokenLogprob(token, float(row[token]) - log_total, top)


def _best(row: np.ndarray, n: int, peak: float) -> np.ndarray:
    """The `n` highest logits' tokens, highest first (ties by token id). Only the tokens
    within a margin of the peak are sorted, the margin widened until there are `n` of them:
    a partition of the whole row (152k logits) took 1.4 ms, ten times the log-softmax."""
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    n = min(n, len(row))
    margin = TOP_MARGIN
    candidates = np.flatnonzero(row >= peak - margin)
    while len(candidates) < n:
        margin *= 4
        wide = margin > TOP_MARGIN_LIMIT  # -inf logits: no margin reaches them
        candidates = np.arange(len(row)) if wide else np.flatnonzero(row >= peak - margin)
    if len(candidates) > TOP_SORTED:  # keep the n-th highest logit and all above or tied
        nth = -np.partition(-row[candidates], n - 1)[n - 1]
        candidates = candidates[row[candidates] >= nth]
    order = np.lexsort((candidates, -row[candidates]))
    return candidates[order[:n]]
