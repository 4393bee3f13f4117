"""Speedup statistics: the geometric mean over prompts of each prompt's median ratio, with a
percentile bootstrap interval that resamples within each prompt (the timing noise)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0  # the same report for the same runs


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return {
            "median": round(self.value, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
        }


def geometric_mean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def speedup_estimate(
    groups: Sequence[Sequence[float]], draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED
) -> Estimate | None:
    """Geometric mean over groups (prompts) of each group's median ratio, with a percentile
    bootstrap interval that resamples within each group (the timing noise of this machine)."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return None
    point = geometric_mean(float(np.median(a)) for a in arrays)
    rng = np.random.default_rng(seed)
    log_sum = np.zeros(draws)
    for a in arrays:
        samples = a[rng.integers(0, len(a), size=(draws, len(a)))]
        log_sum += np.log(np.median(samples, axis=1))
    boot = np.exp(log_sum / len(arrays))
    low, high = np.percentile(boot, [2.5, 97.5])
    return Estimate(point, float(low), float(high))
