"""Ways to propose draft tokens for the target to verify."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .backend import Backend, logits_for_suffix
from .sampling import Distribution, SamplingSettings, distribution


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distribution each was drawn from (needed by the exact rule)."""

    tokens: list[int]
    dists: list[Distribution]
    source: str

    @classmethod
    def empty(cls) -> Draft:
        return cls([], [], "none")


class Drafter(Protocol):
    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
    ) -> Draft: ...


@dataclass
class ModelDrafter:
    """A small model run ahead of the target, one token per decode.

    Drafting stops early when the drafter's probability for its likeliest token falls below
    `min_confidence`: an unsure drafter is usually wrong, and a wasted draft step costs
    about half a target step on CPU.
    """

    backend: Backend
    min_confidence: float = 0.0
    steps: int = field(default=0, init=False)

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
    ) -> Draft:
        tokens: list[int] = []
        dists: list[Distribution] = []
        sequence = list(context)
        for _ in range(max_tokens):
            row = logits_for_suffix(self.backend, sequence, 1)[0]
            self.steps += 1
            dist = distribution(row, sampling)
            # Decide before drawing: a stop that depends on the drawn token would bias the
            # drafts the exact rule sees, and answers would no longer follow the target.
            if self.min_confidence > 0.0 and _confidence(row, dist, sampling) < self.min_confidence:
                break
            token = dist.sample(rng) if not sampling.greedy else int(dist.ids[0])
            tokens.append(token)
            dists.append(dist)
            sequence.append(token)
            if self.backend.is_end_of_generation(token):
                break
        return Draft(tokens, dists, "model")


def _confidence(row: np.ndarray, dist: Distribution, sampling: SamplingSettings) -> float:
    """The drafter's probability for its likeliest token (raw softmax when greedy)."""
    if not sampling.greedy:
        return float(dist.probs[0])
    shifted = np.exp(row - row.max())
    return float(1.0 / shifted.sum())
