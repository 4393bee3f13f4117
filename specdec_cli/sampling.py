"""Pure numpy sampling: logits processing, and the exact speculative acceptance rule.

The rule is Leviathan et al. (2023) / Chen et al. (2023): a draft token x drawn from the
drafter's distribution q is kept with probability min(1, p(x)/q(x)); at the first
rejection the replacement is drawn from normalise(max(0, p - q)). The emitted sequence
is then distributed exactly as if the target alone had sampled it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Distribution:
    """A sparse probability distribution over token ids (ids sorted by descending probability)."""

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def point(cls, token: int) -> Distribution:
        return cls(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def probs_at(self, ids: np.ndarray) -> np.ndarray:
        order = np.argsort(self.ids)
        sorted_ids = self.ids[order]
        slots = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        found = sorted_ids[slots] == ids
        return np.where(found, self.probs[order][slots], 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        cumulative = np.cumsum(self.probs)
        slot = np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")
        return int(self.ids[min(slot, len(self.ids) - 1)])


def distribution(logits: np.ndarray, settings: SamplingSettings) -> Distribution:
    """Apply temperature, top-k, top-p and min-p (in llama.cpp's order) to one row of logits."""
    if settings.greedy:
        return Distribution.point(int(np.argmax(logits)))
    n = logits.shape[-1]
    k = settings.top_k if 0 < settings.top_k < n else n
    candidates = np.argpartition(logits, n - k)[n - k :] if k < n else np.arange(n)
    chosen = logits[candidates].astype(np.float64)
    order = np.argsort(-chosen, kind="stable")
    candidates, chosen = candidates[order], chosen[order]
    # llama.cpp cuts top-p and min-p on the unscaled softmax; temperature comes last.
    probs = np.exp(chosen - chosen[0])
    probs /= probs.sum()
    keep = len(probs)
    if settings.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), settings.top_p)) + 1)
    if settings.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= settings.min_p * probs[0])))
    kept = np.exp((chosen[:keep] - chosen[0]) / settings.temperature)
    return Distribution(candidates[:keep].astype(np.int64), kept / kept.sum())


def residual(target: Distribution, draft: Distribution) -> Distribution:
    """normalise(max(0, p - q)): where the replacement for a rejected draft is drawn from."""
    ids = np.union1d(target.ids, draft.ids)
    mass = np.maximum(target.probs_at(ids) - draft.probs_at(ids), 0.0)
    total = mass.sum()
    if total <= 0.0:  # p == q up to rounding: any rejection was rounding noise
        return target
    keep = mass > 0
    order = np.argsort(-mass[keep], kind="stable")
    return Distribution(ids[keep][order], mass[keep][order] / total)


@dataclass(frozen=True)
class Verdict:
    """How many draft tokens the target kept, and the token it adds after them."""

    n_accepted: int
    next_token: int


AcceptanceRule = Callable[
    [Sequence[int], Sequence[Distribution], Sequence[Distribution], np.random.Generator], Verdict
]


def speculative_accept(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution],
    target_dists: Sequence[Distribution],
    rng: np.random.Generator,
) -> Verdict:
    """The exact rule. `target_dists` has one more entry than `draft` (the bonus position)."""
    for i, token in enumerate(draft):
        p, q = target_dists[i].prob(token), draft_dists[i].prob(token)
        if q <= 0.0:
            raise ValueError(f"draft token {token} has zero probability under its own drafter")
        if rng.random() * q >= p:  # reject with probability 1 - min(1, p/q)
            return Verdict(i, residual(target_dists[i], draft_dists[i]).sample(rng))
    return Verdict(len(draft), target_dists[len(draft)].sample(rng))


def greedy_accept(draft: Sequence[int], target_logits: np.ndarray) -> Verdict:
    """Greedy verification in one vectorised pass: keep drafts while they equal the argmax."""
    choices = np.argmax(target_logits, axis=-1)
    mismatches = np.flatnonzero(choices[: len(draft)] != np.asarray(draft, dtype=choices.dtype))
    n_accepted = int(mismatches[0]) if mismatches.size else len(draft)
    return Verdict(n_accepted, int(choices[n_accepted]))


def top2_margin(logits: np.ndarray) -> float:
    """The gap between the two largest logits: small means a near-tie rounding can flip."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])
