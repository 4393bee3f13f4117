"""Emitted tokens' log-probabilities (OpenAI's `logprobs`): each under the target's raw
distribution at its position, the log-softmax of the logits the target computed there,
before temperature, top-k/top-p/min-p and any grammar. In exact mode those logits are the
target alone's, bit for bit, so a drafter changes no log-probability either."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's most alternatives a token (chat completions' top_logprobs)
# The alternatives are sought in the blocks of BLOCK logits whose highest are among the
# row's n highest blocks' (the n best tokens lie in them: 255 µs a token for 20 of Qwen's
# 152k logits on a 2-core Zen 4, log-softmax included); more than TOP_SORTED candidates (a
# row of ties) are cut at the n-th highest logit before they are sorted.
BLOCK = 64
TOP_SORTED = 4096


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability and the `top` most likely tokens at its position with
    theirs, most likely first (ties by token id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """`token`'s log-probability in the logit row `row`, and the row's `n_top` best."""
    peak = row.max()
    # In place: a second fresh array for exp's output took 400 µs more (152k logits).
    shifted = np.subtract(row, peak, dtype=np.float32)
    np.exp(shifted, out=shifted)
    # float64 sum: 152k terms in float32 would lose the small ones' share
    log_total = float(peak) + float(np.log(shifted.sum(dtype=np.float64)))
    top = tuple((int(t), float(row[t]) - log_total) for t in _best(row, n_top))
    return TokenLogprob(token, float(row[token]) - log_total, top)


def _best(row: np.ndarray, n: int) -> np.ndarray:
    """The `n` highest logits' tokens, highest first (ties by token id). The blocks whose
    highest logits are the n highest hold n logits at least as high as the n-th of those,
    so the n best are among those logits: only they are sorted (a partition of the whole
    row, 152k logits, took 1.4 ms, ten times the log-softmax)."""
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    n = min(n, len(row))
    highest = np.maximum.reduceat(row, np.arange(0, len(row), BLOCK))
    if n <= len(highest):
        nth = -np.partition(-highest, n - 1)[n - 1]
        blocks = np.flatnonzero(highest >= nth)
        candidates = (blocks[:, None] * BLOCK + np.arange(BLOCK)).ravel()
        candidates = candidates[candidates < len(row)]
        candidates = candidates[row[candidates] >= nth]
    else:  # fewer blocks than tokens wanted
        candidates = np.arange(len(row))
    if len(candidates) > TOP_SORTED:  # a row of ties: cut at the n-th highest logit
        cut = -np.partition(-row[candidates], n - 1)[n - 1]
        candidates = candidates[row[candidates] >= cut]
    order = np.argsort(-row[candidates], kind="stable")  # candidates ascend: ties by id
    return candidates[order[:n]]
