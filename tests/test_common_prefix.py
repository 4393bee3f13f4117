"""decoding.backend.common_prefix_length: what every round asks of the whole context, so it
compares lists in C and halves to a mismatch; against a plain loop, for every kind of
sequence the callers pass (the cache's list, a cached prompt's tuple, an array)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specdec_cli.decoding.backend import common_prefix_length


def shared_by_loop(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


KINDS = {"list": list, "tuple": tuple, "array": lambda t: np.array(t, dtype=np.int64)}


@pytest.mark.parametrize("left_kind", sorted(KINDS))
@pytest.mark.parametrize("right_kind", sorted(KINDS))
def test_the_shared_prefix_is_what_a_loop_finds(left_kind, right_kind):
    rng = random.Random(f"{left_kind}-{right_kind}")
    for _ in range(2000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 70))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 9))]
        left, right = KINDS[left_kind](a), KINDS[right_kind](b)
        assert common_prefix_length(left, right) == shared_by_loop(a, b), (a, b)
        assert common_prefix_length(right, left) == shared_by_loop(b, a), (b, a)


def test_a_mismatch_anywhere_in_a_long_context_is_found():
    context = list(range(5000))
    for at in (0, 1, 2047, 2048, 4998, 4999):
        edited = context[:at] + [-1] + context[at + 1 :]
        assert common_prefix_length(context, edited) == at
    assert common_prefix_length(context, [*context, 7]) == len(context)
