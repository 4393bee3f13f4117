"""Predicted Outputs: drafts that follow a prediction, and what they are counted as."""

from __future__ import annotations

import json
import random

import pytest
from fakes import FakeBackend, sequence_model
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.commands.chat import Command, parse_command
from specdec_cli.decoding.adaptive import AdaptiveDrafter
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.drafters import NO_MATCH, NgramMatch, PredictionIndex, first_after
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.ngram import NgramTable

PREDICTION = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]


def test_lookup_follows_the_prediction_from_where_the_answer_stands():
    index = PredictionIndex(PREDICTION)
    match = index.lookup([5, 10, 11], 4)
    assert match.tokens == (12, 13, 14, 15) and match.length == 2


def test_lookup_only_looks_and_take_moves_on():
    index = PredictionIndex([1, 2, 3, 1, 2, 4])
    assert index.lookup([1, 2], 1).tokens == (3,)
    assert index.lookup([1, 2], 1).tokens == (3,)  # asking again changes nothing
    draft = index.take(index.lookup([1, 2], 1), 1)
    assert draft.tokens == [3] and draft.source == "prediction"
    assert index.lookup([1, 2], 1).tokens == (4,)  # the later occurrence, after the taken one


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ([10, 11, 99, 13], (14, 15)),  # a changed token: picked up again after it
        ([10, 11, 98, 99, 12], (13, 14)),  # an inserted span
        ([10, 11, 15], (16, 17)),  # a deleted span
    ],
    ids=["changed", "inserted", "deleted"],
)
def test_lookup_picks_the_prediction_up_again_after_an_edit(answer, expected):
    assert PredictionIndex(PREDICTION).lookup(answer, 2).tokens == expected


def test_no_draft_where_the_answer_is_not_in_the_prediction():
    assert PredictionIndex(PREDICTION).lookup([1, 2, 3], 4).tokens == ()


# --- in the engine: the answer stays the target's, the counts are OpenAI's ---------------------

PROMPT = [0, 1]
# The target's answer: the prediction with one token changed and one span inserted.
ANSWER = [10, 11, 12, 13, 40, 15, 16, 17, 41, 42, 18, 19, 20, 21]
EOS = 9


def target() -> FakeBackend:
    model = sequence_model([*ANSWER, EOS], len(PROMPT), 64, after=EOS)
    return FakeBackend(model, 64, end_of_generation={EOS})


def generate(prediction, drafter=True):
    costs = CostModel({1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.0, learn=False)
    settings = GenerationSettings(max_tokens=40, draft_max=8, prediction=tuple(prediction))
    drafting = AdaptiveDrafter(costs) if drafter else None
    return Generation(target(), PROMPT, settings, drafting).run()


def test_drafts_from_a_prediction_keep_the_answer_and_are_counted():
    alone = generate(PREDICTION, drafter=False)
    predicted = generate(PREDICTION)
    assert predicted.tokens == alone.tokens == ANSWER
    stats = predicted.stats
    assert stats.draft_sources["prediction"] > 0
    # 11 of the answer's 14 tokens are in the prediction; the first is the prompt's round's,
    # and after each edit the target's own next token is needed to pick the prediction up.
    assert stats.accepted_prediction_tokens >= 8
    assert stats.rejected_prediction_tokens >= 2  # at the changed and at the inserted tokens
    assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens == stats.drafted
    assert stats.target_passes < alone.stats.target_passes / 2
    record = stats.as_dict()
    assert record["accepted_prediction_tokens"] == stats.accepted_prediction_tokens


def test_without_a_prediction_nothing_is_counted_as_predicted():
    stats = generate(()).stats
    assert stats.accepted_prediction_tokens == stats.rejected_prediction_tokens == 0


# --- run --predict and chat /predict ------------------------------------------------------------

runner = CliRunner()


def run_args(tiny_models, *extra: str) -> list[str]:
    return ["run", "--raw", "--target", str(tiny_models.target), "-n", "30", "--json", *extra]


def test_run_predict_keeps_the_answer_and_reports_prediction_counts(tiny_models, tmp_path):
    plain = runner.invoke(app, run_args(tiny_models, "the cat sat on", "--no-draft"))
    answer = json.loads(plain.stdout)["text"]
    predicted_file = tmp_path / "expected.txt"
    predicted_file.write_text(answer)
    args = run_args(tiny_models, "the cat sat on", "--drafter", "ngram")
    result = runner.invoke(app, [*args, "--predict", str(predicted_file)])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["text"] == answer
    assert record["stats"]["accepted_prediction_tokens"] > 0
    assert record["settings"]["predicted"] is True


def test_run_predict_from_stdin_needs_the_prompt_as_an_argument(tiny_models):
    result = runner.invoke(app, run_args(tiny_models, "--predict", "-"), input="some text")
    assert result.exit_code != 0
    assert "--predict -" in result.output and "argument" in result.output


def test_run_predict_with_a_missing_file_is_one_clear_line(tiny_models, tmp_path):
    missing = tmp_path / "nope.py"
    result = runner.invoke(app, run_args(tiny_models, "hello", "--predict", str(missing)))
    assert result.exit_code != 0
    assert "cannot read the prediction" in result.output
    assert "Traceback" not in result.output


def test_chat_predict_command():
    assert parse_command("/predict app.py") == Command("predict", "app.py")


def indexed_prediction_lookup(prediction, answer, cursor, max_tokens):
    """The lookup as an NgramTable of the prediction's 1- to 12-grams answered it before the
    scan: the longest ending of the answer that occurs in the prediction with tokens after
    it there, the first such place after the cursor."""
    table = NgramTable(range(1, PredictionIndex.MAX_N + 1))
    table.extend(prediction)
    for n in range(min(PredictionIndex.MAX_N, len(answer)), 0, -1):
        ends = table.ends(answer[len(answer) - n :])
        if ends:
            end = first_after(ends, cursor)
            following = table.following(end, max_tokens)
            if following:
                return NgramMatch(following, n, end)
    return NO_MATCH


@pytest.mark.parametrize("alphabet", [2, 3, 8])
def test_the_scan_finds_what_indexing_every_ngram_of_the_prediction_found(alphabet):
    rng = random.Random(alphabet)
    for _ in range(400):
        prediction = [rng.randrange(alphabet) for _ in range(rng.randint(0, 50))]
        index = PredictionIndex(prediction)
        answer = [rng.randrange(alphabet) for _ in range(rng.randint(0, 30))]
        for _ in range(3):
            max_tokens = rng.randint(1, 20)
            want = indexed_prediction_lookup(prediction, answer, index._cursor, max_tokens)
            match = index.lookup(answer, max_tokens)
            assert match == want, (prediction, answer, index._cursor)
            if match.tokens:
                index.take(match, max_tokens)
                answer = [*answer, *match.tokens[: rng.randint(1, len(match.tokens))]]
