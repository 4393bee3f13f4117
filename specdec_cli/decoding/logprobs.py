"""Emitted tokens' log-probabilities (OpenAI's `logprobs`): each under the target's raw
distribution at its position, the log-softmax of the logits the target computed there,
before temperature, top-k/top-p/min-p and any grammar. In exact mode those logits are the
target alone's, bit for bit, so a drafter changes no log-probability either."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import likeliest, softmax_weights

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
    peak, _, total = softmax_weights(row)
    log_total = peak + float(np.log(total))
    top = tuple((int(t), float(row[t]) - log_total) for t in likeliest(row, n_top))
    return TokenLogprob(token, float(row[token]) - log_total, top)
