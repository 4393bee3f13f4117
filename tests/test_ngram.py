"""N-grams: the table the indexes share (ngram.py); prompt lookup: the n-gram index, its
cursor, and the n-gram drafter."""

from __future__ import annotations

import random

import pytest
from fakes import SlicesTaken

from specdec_cli.decoding.drafters import (
    NO_MATCH,
    NgramDrafter,
    NgramIndex,
    NgramMatch,
    first_after,
)
from specdec_cli.decoding.ngram import SEPARATOR, NgramTable
from specdec_cli.decoding.sampling import GumbelChooser, SamplingSettings

A, B, W, X, Y, Z = 1, 2, 9, 10, 11, 12
# "a b" occurred twice before the text's ending "a b": first followed by X, then by Y.
TWICE = [A, B, X, Z, A, B, Y, W, A, B]


def test_the_table_keeps_where_each_ngram_ended_as_tokens_are_appended():
    table = NgramTable(range(1, 3))
    table.extend([A, B])
    table.extend([A, B, X])
    assert table.ends([A, B]) == [1, 3] and table.ends([B, A]) == [2]
    assert table.ends([B]) == [1, 3] and table.ends([X]) == [4]
    assert table.ends([A, B, A]) == []  # 3 is not one of its sizes
    assert table.following(1, 2) == (A, B) and table.following(1, 100) == (A, B, X)


def test_no_ngram_or_continuation_of_the_table_crosses_a_document_end():
    table = NgramTable(range(1, 3))
    table.extend([A, B])
    table.end_document()
    table.extend([X, A])
    assert table.ends([SEPARATOR, X]) == [] and table.ends([B, SEPARATOR]) == []
    assert table.ends([X]) == [3] and table.ends([X, A]) == [4] and table.ends([A]) == [0, 4]
    assert table.following(0, 100) == (B,) and table.following(3, 100) == (A,)


def index_of(tokens: list[int]) -> NgramIndex:
    index = NgramIndex()
    index.sync(tokens)
    return index


def test_the_longest_earlier_match_wins():
    index = index_of([A, B, X, B, Y, A, B])  # "b" alone was followed by Y last; "a b" by X
    match = index.lookup(4)
    assert match.length == 2 and match.tokens[0] == X


def test_no_earlier_occurrence_is_no_match():
    match = index_of([A, B, X]).lookup(4)
    assert match.tokens == () and match.length == 0


def test_the_continuation_stops_at_max_tokens_and_at_the_text_end():
    index = index_of(TWICE)
    assert index.lookup(2).tokens == (X, Z)
    assert index.lookup(100).tokens == tuple(TWICE[2:])


def test_a_continuation_from_the_prompt_stops_at_the_answers_start():
    # The prompt is TWICE[:4] ("a b x z"), the answer so far the rest; the ending "a b" also
    # occurred in the prompt, where what followed ran on into the answer's first tokens.
    drafter = NgramDrafter()
    drafter.begin(prompt_length=4, prediction=())
    match = drafter.candidates([*TWICE[:4], A, B, Y, W, A, B], 100)
    assert match.tokens == (X, Z)
    # Without a prompt boundary the same lookup runs on across it.
    assert NgramDrafter().candidates([*TWICE[:4], A, B, Y, W, A, B], 100).tokens[2:4] == (A, B)


def test_a_match_ending_where_the_prompt_ends_is_passed_over_for_a_shorter_one():
    drafter = NgramDrafter()
    drafter.begin(prompt_length=3, prediction=())
    # "b x" ends the prompt: nothing of the prompt follows it. "x" alone occurred later too.
    match = drafter.candidates([A, B, X, Y, Z, X, W, B, X], 100)
    assert match.length == 1 and match.tokens == (W, B, X)


def test_looking_does_not_move_the_cursor():
    index = index_of(TWICE)
    first = index.lookup(3)
    assert index.lookup(3) == first
    assert first.tokens[0] == X


def test_taking_a_match_moves_on_to_the_next_occurrence():
    index = index_of(TWICE)
    index.take(index.lookup(3))
    assert index.lookup(3).tokens[0] == Y
    index.take(index.lookup(3))
    assert index.lookup(3).tokens[0] == Y  # no later occurrence: the last one again


def test_an_edited_history_starts_over():
    index = index_of(TWICE)
    index.take(index.lookup(3))
    index.sync([A, B, Z, *TWICE[3:]])  # an early token changed: a new conversation
    assert index.lookup(3).tokens[0] == Z  # from the first occurrence again


def test_the_drafter_proposes_and_takes():
    drafter = NgramDrafter()
    rng = GumbelChooser(0)
    first = drafter.propose(TWICE, 2, SamplingSettings(), rng)
    second = drafter.propose(TWICE, 2, SamplingSettings(), rng)
    assert (first.tokens, first.source, first.match_length) == ([X, Z], "ngram", 2)
    assert second.tokens == [Y, W]
    assert all(d.probs[0] == 1.0 for d in first.dists)  # certain: point masses


# --- the scan against the n-gram index it replaced --------------------------------------------


def indexed_lookup(tokens, max_n, min_n, answer_start, cursor, max_tokens):
    """Prompt lookup as an NgramTable of every n-gram from 1 to max_n tokens answered it
    before the scan: the longest n whose n-gram ended earlier (not at the text's end, nor where
    the prompt ends), the first such end after the cursor."""
    table = NgramTable(range(1, max_n + 1))
    table.extend(tokens)
    last = len(tokens) - 1
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        ends = table.ends(tokens[last - n + 1 :])
        earlier = [end for end in ends if end != last and end != answer_start - 1]
        if earlier:
            end = first_after(earlier, cursor)
            if end < answer_start:
                max_tokens = min(max_tokens, answer_start - end - 1)
            return NgramMatch(table.following(end, max_tokens), n, end)
    return NO_MATCH


@pytest.mark.parametrize("alphabet", [2, 3, 8])
def test_the_scan_finds_what_indexing_every_ngram_found(alphabet):
    rng = random.Random(alphabet)
    for _ in range(400):
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(0, 60))]
        max_n, min_n = rng.choice([(16, 1), (4, 1), (6, 2)])
        index = NgramIndex(max_n=max_n, min_n=min_n)
        index.answer_start = rng.randint(0, len(tokens))
        index.sync(tokens[: len(tokens) // 2])
        index.sync(tokens)  # grown in two steps, as a context is
        for _ in range(3):
            max_tokens = rng.randint(1, 20)
            cursor = index._cursor
            want = indexed_lookup(tokens, max_n, min_n, index.answer_start, cursor, max_tokens)
            match = index.lookup(max_tokens)
            assert match == want, (tokens, max_n, min_n, index.answer_start, cursor)
            index.take(match)


def test_the_engines_growing_context_is_not_compared_again_each_round():
    context = SlicesTaken(TWICE)
    index = NgramIndex()
    index.sync(context)
    context += [X, Z]
    context.slices.clear()
    index.sync(context)  # the same list, appended to: only the new tokens are read
    assert context.slices == [slice(len(TWICE), None)]
    assert index.lookup(3).tokens == (A, B, Y)  # "a b x z" was followed by "a b y" before
    copy = SlicesTaken(context)
    index.sync(copy)  # another list: compared with what was indexed
    assert copy.slices[0] == slice(None, len(context))
