"""The planner's learned acceptance rates: how likely the target is to keep a draft token,
learned as the answer goes from priors by source, confidence and match length. (The rules
that decide which tokens are kept are verification.py's.)"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .drafters import (
    MODEL_SOURCES,
    Draft,
    DraftSource,
)
from .policy import (
    CONFIDENCE_EDGES,
    FORCED_FIRST_PRIOR,
    FORCED_NEXT_PRIOR,
    HISTORY_FIRST_PRIORS,
    HISTORY_NEXT_PRIORS,
    MODEL_CONFIDENCE_PRIORS,
    MODEL_FIRST_PRIOR,
    MODEL_FOLLOWING_PRIOR,
    NGRAM_FIRST_PRIORS,
    NGRAM_LENGTH_EDGES,
    NGRAM_NEXT_PRIORS,
    PREDICTION_FIRST_PRIORS,
    PREDICTION_NEXT_PRIOR,
    RATE_DECAY,
    RATE_PRIOR_WEIGHT,
    REALISM_DECAY,
    REALISM_WEIGHT,
)


@dataclass
class Rate:
    """A success rate learned online, starting from a prior worth `weight` observations and
    forgetting slowly, so it follows the text as it changes (or, with `observe`, a running
    mean of any measured value)."""

    prior: float
    weight: float = RATE_PRIOR_WEIGHT
    decay: float = RATE_DECAY
    hits: float = field(init=False)
    total: float = field(init=False)

    def __post_init__(self) -> None:
        self.hits, self.total = self.prior * self.weight, self.weight

    @property
    def value(self) -> float:
        return self.hits / self.total

    def update(self, hit: bool) -> None:
        self.observe(float(hit))

    def observe(self, value: float) -> None:
        self.hits = self.hits * self.decay + value
        self.total = self.total * self.decay + 1.0


def realism() -> Rate:
    """Model drafts' realised over planned tokens per second (see REALISM_LIMITS)."""
    return Rate(1.0, REALISM_WEIGHT, REALISM_DECAY)


@dataclass
class AcceptanceModel:
    """How likely the target is to keep a draft token.

    Model drafts: by the drafter's confidence (calibrated per confidence bucket).
    N-gram drafts: the first token by match length; each later one given the one before.
    Forced drafts (text a constraint forces): the first token, and each later one.
    """

    by_confidence: list[Rate] = field(
        default_factory=lambda: [Rate(p) for p in MODEL_CONFIDENCE_PRIORS]
    )
    ngram_first: dict[int, Rate] = field(default_factory=dict)
    ngram_following: dict[int, Rate] = field(default_factory=dict)
    model_first: Rate = field(default_factory=lambda: Rate(MODEL_FIRST_PRIOR))
    model_following: Rate = field(default_factory=lambda: Rate(MODEL_FOLLOWING_PRIOR))
    prediction_first: dict[int, Rate] = field(default_factory=dict)
    prediction_next: Rate = field(default_factory=lambda: Rate(PREDICTION_NEXT_PRIOR))
    history_first: dict[int, Rate] = field(default_factory=dict)
    history_following: dict[int, Rate] = field(default_factory=dict)
    forced_first: Rate = field(default_factory=lambda: Rate(FORCED_FIRST_PRIOR))
    forced_following: Rate = field(default_factory=lambda: Rate(FORCED_NEXT_PRIOR))

    def for_confidence(self, confidence: float) -> Rate:
        return self.by_confidence[int(np.searchsorted(CONFIDENCE_EDGES, confidence, "right"))]

    def for_prediction(self, match_length: int) -> Rate:
        return _bucket_rate(self.prediction_first, PREDICTION_FIRST_PRIORS, match_length)

    def for_ngram(self, match_length: int) -> Rate:
        return _ngram_rate(self.ngram_first, NGRAM_FIRST_PRIORS, match_length)

    def ngram_next(self, match_length: int) -> Rate:
        return _ngram_rate(self.ngram_following, NGRAM_NEXT_PRIORS, match_length)

    def for_history(self, match_length: int) -> Rate:
        return _ngram_rate(self.history_first, HISTORY_FIRST_PRIORS, match_length)

    def history_next(self, match_length: int) -> Rate:
        return _ngram_rate(self.history_following, HISTORY_NEXT_PRIORS, match_length)

    def learn(self, draft: Draft, n_accepted: int) -> None:
        if draft.after is not None:  # forced text, then another source's continuation
            own = draft.own_length
            self.learn(draft.cut(own), n_accepted)
            if n_accepted >= own:
                self.learn(draft.after, n_accepted - own)
            return
        checked = min(len(draft.tokens), n_accepted + 1)  # tokens after a rejection are unseen
        for i in range(checked):
            hit = i < n_accepted
            if draft.source in MODEL_SOURCES:
                self.for_confidence(draft.confidences[i]).update(hit)
                (self.model_first if i == 0 else self.model_following).update(hit)
            elif draft.source == DraftSource.NGRAM:
                length = draft.match_length
                (self.for_ngram(length) if i == 0 else self.ngram_next(length)).update(hit)
            elif draft.source == DraftSource.PREDICTION:
                first = self.for_prediction(draft.match_length)
                (first if i == 0 else self.prediction_next).update(hit)
            elif draft.source == DraftSource.FORCED:
                (self.forced_first if i == 0 else self.forced_following).update(hit)
            elif draft.source == DraftSource.HISTORY:
                length = draft.match_length
                (self.for_history(length) if i == 0 else self.history_next(length)).update(hit)


def _bucket_rate(rates: dict[int, Rate], priors: Sequence[float], match_length: int) -> Rate:
    """The rate for a match length: lengths from len(priors) on share the last one."""
    bucket = min(match_length, len(priors))
    if bucket not in rates:
        rates[bucket] = Rate(priors[bucket - 1])
    return rates[bucket]


def _ngram_rate(rates: dict[int, Rate], priors: Sequence[float], match_length: int) -> Rate:
    """The rate for an n-gram match of this length (its NGRAM_LENGTH_EDGES bucket)."""
    return _bucket_rate(rates, priors, 1 + bisect.bisect_right(NGRAM_LENGTH_EDGES, match_length))


def expected_tokens(first: float, following: float, k: int) -> float:
    """Tokens a round emits when drafting k: the target's own token plus each draft token
    that survives (the i-th survives with probability first * following^(i-1))."""
    if k <= 0:
        return 1.0
    return 1.0 + first * sum(following**i for i in range(k))
