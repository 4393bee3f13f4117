"""Verification: which draft tokens the target keeps, and the token it adds after them.

A `Verdict` is the result of one round: the number of draft tokens accepted, and the next
token, which is the target's correction at the first rejected position or, when the whole
draft was accepted, the bonus token after it. Three rules give one:

- greedy (temperature 0): keep drafts while they equal the target's argmax;
- invariant (`SamplingRule.INVARIANT`, the default when sampling): keep a draft token
  exactly when it is the target's own Gumbel-max choice at its position, so the answer for
  a seed is the target alone's, drafter or not;
- classic (`SamplingRule.CLASSIC`): Leviathan et al. (2023) / Chen et al. (2023). A draft
  token x drawn from the drafter's distribution q is kept with probability min(1, p(x)/q(x));
  at the first rejection the replacement is drawn from normalise(max(0, p - q)). The output
  is distributed as the target alone's, but the answer for a seed depends on the drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .backend import Choices
from .sampling import Distribution, TokenChooser, residual


class SamplingRule(str, Enum):
    """How sampled drafts are verified (greedy decoding needs no rule: the argmax decides).

    INVARIANT: every token is chosen by Gumbel-max with noise keyed by (seed, position),
    for the target alone and the drafters alike, and a draft token is kept when it is the
    target's own choice: the same seed gives the same answer with or without a drafter.
    CLASSIC: Leviathan/Chen rejection sampling: keeps more drafts, exact in distribution,
    but the answer for a seed depends on what was drafted."""

    INVARIANT = "invariant"
    CLASSIC = "classic"


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


def invariant_accept(
    draft: Sequence[int],
    target_dists: Sequence[Distribution],
    chooser: TokenChooser,
    first_position: int,
) -> Verdict:
    """Keep a draft token exactly when it is the target's own choice at its position; the
    first one that is not is replaced by that choice. The answer is the target alone's."""
    for i, token in enumerate(draft):
        choice = chooser.pick(target_dists[i], first_position + i)
        if choice != token:
            return Verdict(i, choice)
    return Verdict(len(draft), chooser.pick(target_dists[len(draft)], first_position + len(draft)))


def greedy_accept(draft: Sequence[int], choices: Choices) -> Verdict:
    """Keep drafts while each equals its row's greedy choice (the target's argmax there).
    Rows after the first mismatch are never read (backend.ArgmaxRows takes a choice when
    read)."""
    for i, token in enumerate(draft):
        choice = choices[i]
        if choice != token:
            return Verdict(i, choice)
    return Verdict(len(draft), choices[len(draft)])
