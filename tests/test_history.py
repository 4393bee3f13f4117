"""Drafts from earlier prompts and answers: the index, its file on disk, and the drafter's use."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest
from fakes import ScriptedClock, TimedBackend, sequence_model, table_cost
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.adaptive import AdaptiveDrafter
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.drafters import NO_MATCH, NgramDrafter
from specdec_cli.decoding.engine import Generation, GenerationSettings, Round
from specdec_cli.decoding.history import KEY_TOKENS, HistoryIndex
from specdec_cli.decoding.modes import use_history
from specdec_cli.services.history_file import HistoryFile, summarize

KEY = [1, 2, 3, 4]  # an ending four tokens long: the shortest a lookup keys on


def index_of(*documents: list[int], max_tokens: int = 10_000) -> HistoryIndex:
    index = HistoryIndex(max_tokens)
    for document in documents:
        index.add(document)
    return index


def test_the_longest_earlier_match_wins():
    # Both documents hold the key; only the first also holds the token before it (9).
    index = index_of([9, *KEY, 20, 21], [8, *KEY, 30, 31])
    match = index.lookup([7, 9, *KEY], 8)
    assert match.tokens == (20, 21) and match.length == KEY_TOKENS + 1


def test_of_equally_long_matches_the_most_frequent_continuation_wins():
    index = index_of([*KEY, 20, 5], [*KEY, 20, 7], [*KEY, 30, 6], [*KEY, 20, 9], [*KEY, 30, 8])
    match = index.lookup(KEY, 8)
    assert match.tokens == (20, 9)  # 20 three times, 30 twice; of the 20s the most recent


def test_a_tie_goes_to_the_most_recent():
    assert index_of([*KEY, 20], [*KEY, 30]).lookup(KEY, 8).tokens == (30,)


def test_a_continuation_stops_at_its_documents_end_and_at_max_tokens():
    index = index_of([*KEY, 20, 21, 22], [40, 41, 42, 43, 44])
    assert index.lookup(KEY, 8).tokens == (20, 21, 22)
    assert index.lookup(KEY, 2).tokens == (20, 21)


def test_an_ending_shorter_than_the_key_or_unseen_is_no_match():
    index = index_of([*KEY, 20])
    assert index.lookup(KEY[1:], 8).tokens == ()
    assert index.lookup([5, 6, 7, 8], 8).tokens == ()


def test_a_match_never_spans_two_documents():
    index = index_of([1, 2], [3, 4, 20])
    assert index.lookup(KEY, 8).tokens == ()


def test_past_its_bound_the_oldest_documents_go_first():
    index = index_of([*KEY, 20], max_tokens=12)
    index.add([11, 12, 13, 14, 15])
    assert index.lookup(KEY, 8).tokens == (20,)  # 10 tokens: within the bound
    index.add([21, 22, 23, 24, 25])  # 15 tokens: trimmed to three quarters of the bound
    assert index.tokens <= 9 and index.documents() == [(21, 22, 23, 24, 25)]
    assert index.lookup(KEY, 8).tokens == ()  # the oldest are gone
    assert index.lookup([21, 22, 23, 24], 8).tokens == (25,)


# --- on disk -------------------------------------------------------------------------------


def test_a_history_file_keeps_documents_across_runs(tmp_path):
    HistoryFile(tmp_path, "vocab").append([*KEY, 20, 21])
    HistoryFile(tmp_path, "vocab").append([5, 6, 7, 8, 9])
    index, damaged = HistoryFile(tmp_path, "vocab").load()
    assert damaged == 0 and len(index) == 2
    assert index.lookup(KEY, 8).tokens == (20, 21)
    assert HistoryFile(tmp_path, "other").load()[0].tokens == 0  # another vocabulary's file


@pytest.mark.parametrize(
    "bad_line",
    [
        '{"tokens": [1, 2, 3',  # cut off mid-write
        '{"tokens": [1, -2, 3]}',  # not token ids
        '{"tokens": "1 2 3"}',
        '{"text": "hello"}',
        "\x00\x01garbage",
    ],
)
def test_a_damaged_line_is_skipped_and_counted_never_trusted(tmp_path, bad_line):
    file = HistoryFile(tmp_path, "vocab")
    file.append([*KEY, 20])
    with open(file.path, "a") as out:
        out.write(bad_line + "\n")
    file.append([5, 6, 7, 8, 30])
    index, damaged = file.load()
    assert damaged == 1 and len(index) == 2
    assert index.lookup(KEY, 8).tokens == (20,)


DOCUMENTS_EACH = 300


def _append_many(folder, worker: int) -> None:
    file = HistoryFile(folder, "vocab", max_tokens=10**6)  # no trimming: every line counts
    for i in range(DOCUMENTS_EACH):
        file.append([worker, i, *range(200)])


def test_two_writers_at_once_lose_and_mix_nothing(tmp_path):
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_append_many, args=(tmp_path, w)) for w in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    index, damaged = HistoryFile(tmp_path, "vocab").load()
    assert damaged == 0
    assert sorted(d[:2] for d in index.documents()) == sorted(
        (w, i) for w in (1, 2) for i in range(DOCUMENTS_EACH)
    )


def test_a_file_past_twice_its_bound_is_trimmed_to_the_newest(tmp_path):
    file = HistoryFile(tmp_path, "vocab", max_tokens=60)
    for i in range(30):
        file.append([i, *range(100, 110)])
    lines = file.path.read_text().splitlines()
    assert file.path.stat().st_size // 6 <= 2 * 60 + 60  # trimmed as it grew
    kept = [json.loads(line)["tokens"][0] for line in lines]
    assert kept == sorted(kept) and kept[-1] == 29


def test_specdec_history_shows_and_clears_a_folder(tmp_path):
    HistoryFile(tmp_path, "vocab").append([*KEY, 20, 21])
    runner = CliRunner()
    shown = runner.invoke(app, ["history", str(tmp_path)])
    assert shown.exit_code == 0 and "1 documents, 6 tokens" in shown.output
    assert summarize(tmp_path)[0].documents == 1
    cleared = runner.invoke(app, ["history", str(tmp_path), "--clear"])
    assert cleared.exit_code == 0 and summarize(tmp_path) == []


def test_specdec_history_without_a_folder_says_how_to_name_one(monkeypatch):
    monkeypatch.delenv("SPECDEC_HISTORY", raising=False)
    result = CliRunner().invoke(app, ["history"])
    assert result.exit_code == 2 and "SPECDEC_HISTORY" in result.output


# --- drafting from it ----------------------------------------------------------------------

N_VOCAB = 64
GREEDY = GenerationSettings(max_tokens=40, draft_max=32)


def answer_for(seed: int) -> list[int]:
    """A JSON-like answer: a fixed scaffold around a few tokens that differ per request."""
    a, b, c, d = (int(v) for v in np.random.default_rng(seed).integers(40, 60, 4))
    scaffold = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15, 16], [17, 18, 19, 20, 21]]
    return [*scaffold[0], a, *scaffold[1], b, *scaffold[2], c, *scaffold[3], d, 22, 23, 24]


def one_answer(history: HistoryIndex | None, seed: int, clock: ScriptedClock):
    prompt = [30 + seed % 10, 31, 32, 33]
    answer = answer_for(seed)
    target = TimedBackend(
        sequence_model(answer, len(prompt), N_VOCAB), N_VOCAB, clock, table_cost(COSTS)
    )
    drafter = AdaptiveDrafter(CostModel(dict(COSTS), 0.0, learn=False), ngram=NgramDrafter())
    use_history(drafter, history)
    events = list(Generation(target, prompt, GREEDY, drafter).events())
    return [e for e in events if isinstance(e, Round)], events[-1], prompt


COSTS = {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.5, 16: 2.5, 32: 4.5}


def test_earlier_answers_are_drafted_and_the_answer_stays_the_same():
    clock = ScriptedClock()
    history = HistoryIndex()
    for seed in range(3):  # three earlier requests of the same kind
        _, finished, prompt = one_answer(None, seed, clock)
        history.add([*prompt, *finished.tokens])
    rounds_without, plain, _ = one_answer(None, 7, clock)
    rounds_with, drafted, _ = one_answer(history, 7, clock)
    assert drafted.tokens == plain.tokens
    assert any(r.source == "history" and r.accepted > 0 for r in rounds_with)
    assert len(rounds_with) < len(rounds_without)


def test_without_history_nothing_is_drafted_from_it():
    rounds, _, _ = one_answer(None, 7, ScriptedClock())
    assert all(r.source != "history" for r in rounds)


def test_loading_a_file_past_its_bound_keeps_the_newest_documents_that_fit(tmp_path):
    writer = HistoryFile(tmp_path, "vocab", max_tokens=10**6)
    for i in range(10):
        writer.append([i, *range(100, 109)])  # 10 tokens each
    index, _ = HistoryFile(tmp_path, "vocab", max_tokens=35).load()
    assert [d[0] for d in index.documents()] == [7, 8, 9]


def test_a_lookup_while_another_thread_appends_sees_only_whole_ngrams():
    # serve --parallel: the slots of one key share its history, and one slot's lookup can
    # run while another's finished answer is being appended. Here the table is caught
    # half-way: an n-gram's end is recorded, the token after it not yet.
    index = HistoryIndex(1000)
    index.add([5, 6, 7, 8, 9, 10])
    index._table.extend([1, 2, 3, 4])  # the context's ending, no continuation yet
    assert index.lookup([0, 1, 2, 3, 4], 4) == NO_MATCH
    index._table.extend([11])
    assert index.lookup([0, 1, 2, 3, 4], 4).tokens == (11,)
