"""Emitted tokens' log-probabilities (decoding/logprobs.py): the log-softmax of the target's
raw row at each position, the same with a drafter as without one (exact mode), and only
computed where asked for; and in OpenAI's shapes (serve/responses.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import (
    GREEDY,
    SAMPLED,
    FakeBackend,
    FixedDrafter,
    model_drafter,
    sequence_model,
    table_target,
)

from specdec_cli.decoding.drafters import ModelDrafter
from specdec_cli.decoding.engine import (
    Finished,
    FinishReason,
    Generation,
    GenerationSettings,
    GenerationStats,
    Piece,
)
from specdec_cli.decoding.logprobs import token_logprob
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.serve.responses import (
    Answer,
    Delta,
    ResponseIds,
    TextShape,
    TokenLogprobs,
    ToolCallShape,
)

PROMPT = [0, 1, 2]


def log_softmax(row) -> np.ndarray:
    row = np.asarray(row, dtype=np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def test_a_tokens_logprob_is_the_log_softmax_of_its_row():
    row = np.random.default_rng(3).normal(0.0, 4.0, 1000).astype(np.float32)
    expected = log_softmax(row)
    result = token_logprob(row, 17, 5)
    assert result.token == 17
    assert result.logprob == pytest.approx(expected[17], abs=1e-5)
    best = np.argsort(-expected)[:5]
    assert [token for token, _ in result.top] == list(best)
    assert [lp for _, lp in result.top] == pytest.approx(list(expected[best]), abs=1e-5)
    assert token_logprob(row, 17, 0).top == ()


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0, 10.0])  # a flat row to a peaked one
@pytest.mark.parametrize("n_top", [1, 5, 20])
def test_the_alternatives_are_the_rows_best_however_flat_it_is(scale, n_top):
    row = np.random.default_rng(int(scale * 10)).normal(0.0, scale, 151936).astype(np.float32)
    best = token_logprob(row, 0, n_top).top
    assert [token for token, _ in best] == list(np.argsort(-row, kind="stable")[:n_top])


def test_tied_alternatives_come_in_token_order():
    row = np.array([0.0, 3.0, 1.0, 3.0, 3.0], dtype=np.float32)
    result = token_logprob(row, 0, 4)
    assert [token for token, _ in result.top] == [1, 3, 4, 2]
    assert sum(np.exp(lp) for _, lp in result.top) + np.exp(result.logprob) == pytest.approx(1.0)
    flat = np.zeros(5000, dtype=np.float32)  # more ties than are sorted: the first ids win
    assert [token for token, _ in token_logprob(flat, 0, 3).top] == [0, 1, 2]
    ragged = np.zeros(1000, dtype=np.float32)  # 15 blocks of 64 and one of 40
    ragged[[999, 5, 960]] = [3.0, 2.0, 1.0]
    assert [token for token, _ in token_logprob(ragged, 0, 4).top] == [999, 5, 960, 0]


def logprob_pieces(
    target, settings: GenerationSettings, drafter=None, prompt=PROMPT
) -> list[Piece]:
    events = list(Generation(target, prompt, settings, drafter).events())
    assert isinstance(events[-1], Finished)
    return [e for e in events if isinstance(e, Piece) and e.token is not None]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", [None, "fixed", "model"])
def test_each_emitted_token_gets_its_rows_logprob(sampling, drafter):
    settings = GenerationSettings(max_tokens=30, draft_max=4, sampling=sampling, seed=5, logprobs=3)
    target = table_target()
    drafters = {None: None, "fixed": FixedDrafter([4, 5, 6]), "model": model_drafter(target)}
    pieces = logprob_pieces(target, settings, drafters[drafter])
    context = list(PROMPT)
    for piece in pieces:
        assert piece.logprob is not None and piece.logprob.token == piece.token
        expected = log_softmax(target.logits_fn(tuple(context)))
        assert piece.logprob.logprob == pytest.approx(expected[piece.token], abs=1e-5)
        assert [t for t, _ in piece.logprob.top] == list(np.argsort(-expected)[:3])
        context.append(piece.token)
    assert len(pieces) > 5


def test_no_logprobs_unless_asked():
    pieces = logprob_pieces(table_target(), GenerationSettings(max_tokens=12, sampling=GREEDY))
    assert pieces and all(piece.logprob is None for piece in pieces)


def test_the_end_of_generation_token_gets_none():
    """It ends the answer and is not in its text or tokens, so not in their logprobs."""
    target = FakeBackend(sequence_model([4, 5, 9], 3, 10), n_vocab=10, end_of_generation=[9])
    pieces = logprob_pieces(target, GenerationSettings(sampling=GREEDY, logprobs=0))
    assert [p.token for p in pieces] == [4, 5, 9]
    assert [p.logprob is None for p in pieces] == [False, False, True]


@pytest.mark.parametrize("device_choices", [False, True])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_drafter_changes_no_logprob_in_exact_mode(tiny_models, sampling, device_choices):
    """Bit for bit: the rows that verify drafts are the rows the target alone computes."""

    def backend(path) -> LlamaBackend:
        return LlamaBackend(path, n_ctx=256, n_threads=2, exact=True, device_choices=device_choices)

    settings = GenerationSettings(max_tokens=40, draft_max=6, sampling=sampling, seed=11,
                                  logprobs=4)  # fmt: skip
    target, drafter = backend(tiny_models.target), backend(tiny_models.close_drafter)
    try:
        prompt = target.tokenize("the cat sat on the mat and", add_special=True)
        alone = logprob_pieces(target, settings, prompt=prompt)
        target.truncate(0)
        drafted = logprob_pieces(target, settings, ModelDrafter(drafter), prompt)
    finally:
        target.close()
        drafter.close()
    assert [p.token for p in drafted] == [p.token for p in alone]
    assert [p.logprob for p in drafted] == [p.logprob for p in alone]
    assert sum(p.kind.value == "accepted" for p in drafted) > 5  # the drafter was right often


# ---- in OpenAI's shapes (serve/responses.py) -------------------------------------------------


def logged(text: str, logprob: float = -0.5) -> TokenLogprobs:
    return TokenLogprobs(text.encode(), logprob, ((text.encode(), logprob), (b"?", -3.0)))


def streamed_logprobs(chunks: list[dict]) -> list[str]:
    return [
        entry["token"]
        for chunk in chunks
        if chunk["choices"] and chunk["choices"][0]["logprobs"]
        for entry in chunk["choices"][0]["logprobs"]["content"]
    ]


def test_a_held_tool_call_sends_its_tokens_logprobs_with_the_calls():
    names = ["get_weather"]
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    tokens = ["Let me check. ", *call[:40], call[40:]]  # content, then the call held back
    shape, ids = ToolCallShape(names), ResponseIds.new("chatcmpl", "m")
    chunks = [c for t in tokens if (c := shape.delta(ids, Delta(t, (logged(t),)), False))]
    assert streamed_logprobs(chunks) == ["Let me check. "]  # the call's text is held
    answer = Answer(Finished("".join(tokens), [], FinishReason.STOP, GenerationStats()), 9, 0)
    closing = shape.closing(ids, answer, False)
    assert closing[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert streamed_logprobs(chunks + closing) == tokens  # every token's, once, in order


def test_completions_logprobs_count_each_tokens_offset_across_chunks():
    shape, ids = TextShape(), ResponseIds.new("cmpl", "m")
    first = shape.delta(ids, Delta("héllo", (logged("hé"), logged("llo"))), False)
    second = shape.delta(ids, Delta(" you", (logged(" you"),)), False)
    assert first is not None and second is not None
    columns = [chunk["choices"][0]["logprobs"] for chunk in (first, second)]
    assert [c["tokens"] for c in columns] == [["hé", "llo"], [" you"]]
    assert [c["text_offset"] for c in columns] == [[0, 2], [5]]
    assert columns[0]["top_logprobs"][0] == {"hé": -0.5, "?": -3.0}
