"""Is the speculative output the target's own? Compare it with the target alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .backend import Backend, common_prefix_length, logits_for_suffix
from .sampling import top2_margin


@dataclass(frozen=True)
class Comparison:
    identical: bool
    first_difference: int | None  # index into the generated tokens
    top2_margin: float | None  # the target's top-2 logit gap at that position

    def as_dict(self) -> dict:
        return {
            "identical": self.identical,
            "first_difference": self.first_difference,
            "top2_margin": None if self.top2_margin is None else round(self.top2_margin, 4),
        }


def compare_outputs(
    target: Backend, prompt: Sequence[int], speculative: Sequence[int], plain: Sequence[int]
) -> Comparison:
    """Where the two token sequences part, measure how close the target's top two choices were
    (one-token decode of the shared prefix, the plain path's own arithmetic)."""
    if list(speculative) == list(plain):
        return Comparison(True, None, None)
    at = common_prefix_length(speculative, plain)
    row = logits_for_suffix(target, [*prompt, *plain[:at]], 1)[0]
    return Comparison(False, at, top2_margin(row))
