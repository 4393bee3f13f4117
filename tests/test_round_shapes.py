"""How a round of several sequences' rows is laid out (llama/batches.round_widths) and how
llama.cpp cuts it into graph computes (equal_split_sizes, its split_equal). Pure."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.llama.batches import equal_split_sizes, round_widths

# The Zen 5's exact table, in milliseconds (test_adaptive.ZEN5).
ZEN5 = {1: 31.9, 2: 30.0, 4: 41.7, 8: 70.1, 16: 151.0, 32: 285.0, 64: 521.0}


def zen5(rows: int) -> float:
    sizes = sorted(ZEN5)
    return float(np.interp(rows, sizes, [ZEN5[n] for n in sizes]))


@pytest.mark.parametrize(
    ("rows", "sizes"),
    [
        ([4, 4, 4, 4], [16]),  # equal shares: one compute
        ([9, 1, 1, 1], [4, 8]),  # one row of each, then the wide one's other eight
        ([1, 9, 1], [3, 8]),
        ([5, 5, 1, 1], [4, 8]),  # the two wide ones are consecutive: one compute for both
        ([3, 1, 3], [3, 2, 2]),  # 0 and 2 are not: a compute each
        ([1, 0, 1], [1, 1]),  # a sequence without rows splits the run
    ],
)
def test_equal_split_takes_equal_shares_of_consecutive_sequences(rows, sizes):
    assert equal_split_sizes(rows, 256) == sizes


def test_equal_split_keeps_each_compute_within_the_ubatch():
    assert equal_split_sizes([8, 8], 8) == [8, 8]  # four of each, twice


def test_a_wide_draft_beside_single_rows_goes_ragged_where_that_is_cheaper():
    assert round_widths([9, 1, 1, 1], zen5, 256) == [9, 1, 1, 1]
    # Two rows beside three of one: padding all to two is one compute of 8 rows (70 ms),
    # ragged two computes (4 + 1 rows, 74 ms).
    assert round_widths([2, 1, 1, 1], zen5, 256) == [2, 2, 2, 2]


def test_a_sequence_between_the_rounds_ones_gets_the_narrowest_parts_rows():
    assert round_widths([9, 0, 1], zen5, 256) == [9, 1, 1]
    assert round_widths([1, 0, 1], zen5, 256) == [1, 1, 1]


def test_without_costs_every_lane_is_padded_to_the_widest():
    assert round_widths([9, 0, 1, 1], None, 256) == [9, 9, 9, 9]
