"""Pure numpy sampling: logits to distributions, the residual the classic rule draws from,
and the token choosers (plain random, and Gumbel-max keyed by seed and position). How a
draft is verified against them is verification.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# The likeliest tokens are sought in the blocks of LIKELIEST_BLOCK logits whose highest are
# among the row's n highest blocks' (the n best lie there): 0.1 ms for 20 of Qwen's 152k
# logits on a 2-core Zen 4; more than LIKELIEST_SORTED candidates (a row of ties) are cut
# at the n-th highest logit before they are sorted.
LIKELIEST_BLOCK = 64
LIKELIEST_SORTED = 4096
# Without top-k, min-p or top-p bound the tokens worth sorting: those reaching min-p's floor,
# or the REACH_FIRST likeliest, 4x more until they hold top-p's mass; REACH_ROUNDING keeps a
# token at either boundary that float32 rounding would leave out (the exact cut follows).
REACH_FIRST = 64
REACH_ROUNDING = 1e-3


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


LOG2_E = np.float32(1.4426950408889634)


def top_probability(row: np.ndarray, top: int) -> float:
    """The raw softmax probability of a row's likeliest token, `top` (its argmax). A drafter
    step whose row comes to the host pays it over the whole vocabulary (a 0.5B step on an
    H200 is 1,140 µs; a backend that takes choices on its device computes it there). For
    152k logits on a 2-core Xeon: powers of two rather than exp(), in place, saved 50 µs;
    einsum's SIMD sum rather than float32 `sum()` (pairwise, 45-60 µs alone) saved 35-45
    more, at 1e-5 relative error. It only plans how long drafts are."""
    shifted = np.subtract(row, row[top], dtype=np.float32)
    shifted *= LOG2_E
    np.exp2(shifted, out=shifted)
    return float(1.0 / np.einsum("i->", shifted))


def distribution(logits: np.ndarray, settings: SamplingSettings) -> Distribution:
    """Apply temperature, top-k, top-p and min-p (in llama.cpp's order) to one row of logits."""
    if settings.greedy:
        return Distribution.point(int(np.argmax(logits)))
    if 0 < settings.top_k < logits.shape[-1]:
        candidates = likeliest(logits, settings.top_k)
        chosen = logits[candidates].astype(np.float64)
        probs = np.exp(chosen - chosen[0])
        probs /= probs.sum()
    else:
        candidates, chosen, probs = _whole_vocabulary(logits, settings)
    # llama.cpp cuts top-p and min-p on the unscaled softmax; temperature comes last.
    keep = len(probs)
    if settings.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), settings.top_p)) + 1)
    if settings.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= settings.min_p * probs[0])))
    kept = np.exp((chosen[:keep] - chosen[0]) / settings.temperature)
    return Distribution(candidates[:keep].astype(np.int64), kept / kept.sum())


def _whole_vocabulary(
    logits: np.ndarray, settings: SamplingSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Without top-k: the softmax over every token, for the likeliest tokens alone that
    min-p or top-p can keep (sorting all of Qwen's 152k took 19 ms a row)."""
    peak, weights, total = softmax_weights(logits)
    candidates = _within_reach(logits, peak, weights, total, settings)
    chosen = logits[candidates].astype(np.float64)
    return candidates, chosen, np.exp(chosen - peak) / total


def softmax_weights(row: np.ndarray) -> tuple[float, np.ndarray, float]:
    """The row's highest logit, each token's exp(logit - highest) and their sum: a token's
    softmax probability is its weight over the sum. In place: a second fresh array for
    exp's output took 400 µs more (152k logits); the float64 sum keeps the small terms'
    share that float32 would lose."""
    peak = row.max()
    weights = np.subtract(row, peak, dtype=np.float32)
    np.exp(weights, out=weights)
    return float(peak), weights, float(weights.sum(dtype=np.float64))


def _within_reach(
    logits: np.ndarray, peak: float, weights: np.ndarray, total: float, settings: SamplingSettings
) -> np.ndarray:
    """The tokens min-p or top-p may keep, likeliest first (all, where neither cuts)."""
    if settings.min_p > 0.0:  # p >= min_p * p_top: a logit at least peak + ln(min_p)
        floor = peak + math.log(settings.min_p) - REACH_ROUNDING
        reached = np.flatnonzero(logits >= floor)
        return reached[np.argsort(-logits[reached], kind="stable")]
    if settings.top_p < 1.0:
        n = REACH_FIRST
        while n < len(logits):
            reached = likeliest(logits, n)
            if weights[reached].sum(dtype=np.float64) / total >= settings.top_p + REACH_ROUNDING:
                return reached
            n *= 4
    return np.argsort(-logits, kind="stable")


def likeliest(row: np.ndarray, n: int) -> np.ndarray:
    """The tokens of the `n` highest logits, highest first (ties by token id). The blocks
    whose highest logits are the n highest blocks' hold n logits at least as high as the
    n-th of those, so the n best are among those logits: only they are sorted (partitioning
    Qwen's 152k logits took 1.1-1.6 ms a row)."""
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    n = min(n, len(row))
    highest = np.maximum.reduceat(row, np.arange(0, len(row), LIKELIEST_BLOCK))
    if n <= len(highest):
        nth = -np.partition(-highest, n - 1)[n - 1]
        blocks = np.flatnonzero(highest >= nth)
        candidates = (blocks[:, None] * LIKELIEST_BLOCK + np.arange(LIKELIEST_BLOCK)).ravel()
        candidates = candidates[candidates < len(row)]
        candidates = candidates[row[candidates] >= nth]
    else:  # more tokens wanted than there are blocks: cut at the n-th highest logit
        candidates = np.flatnonzero(row >= np.partition(row, len(row) - n)[len(row) - n])
    if len(candidates) > max(n, LIKELIEST_SORTED):  # ties: cut at the n-th highest logit
        cut = -np.partition(-row[candidates], n - 1)[n - 1]
        candidates = candidates[row[candidates] >= cut]
    order = np.argsort(-row[candidates], kind="stable")  # candidates ascend: ties by id
    return candidates[order[:n]]


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


# -- choosing a token: one interface for drafters, the verifier and the target alone -------


class TokenChooser(Protocol):
    def pick(self, dist: Distribution, position: int) -> int:
        """The token to emit (or draft) at absolute `position` from `dist`."""
        ...


@dataclass
class RandomChooser:
    """Draws from the distribution with a seeded generator: the classic rule's drafts."""

    rng: np.random.Generator

    def pick(self, dist: Distribution, position: int) -> int:
        return dist.sample(self.rng)


@dataclass(frozen=True)
class GumbelChooser:
    """Gumbel-max with noise keyed by (seed, position, token): argmax(log p + g) is an exact
    sample from p, and the target alone, the drafter and the verifier all see the same noise,
    so the emitted token is a function of the seed and the prefix alone, whoever drafted
    (drafter-invariant speculative decoding, Daliri, Musco and Suresh, 2024)."""

    seed: int

    def pick(self, dist: Distribution, position: int) -> int:
        if len(dist.ids) == 1:
            return int(dist.ids[0])
        with np.errstate(divide="ignore"):
            scores = np.log(dist.probs) + gumbel_noise(self.seed, position, dist.ids)
        return int(dist.ids[int(np.argmax(scores))])


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def gumbel_noise(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise per token id: a counter-based generator (SplitMix64 of seed,
    position and id), so any token's noise is computed alone, in any order, anywhere."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        key = _splitmix64(key ^ np.array([position], dtype=np.uint64))
        bits = _splitmix64(key ^ np.asarray(ids, dtype=np.uint64))
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return -np.log(-np.log(uniform))


def top2_margin(logits: np.ndarray) -> float:
    """The gap between the two largest logits: small means a near-tie rounding can flip."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])
