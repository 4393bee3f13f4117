"""Padded verifications (exactness.VERIFY_PADDING): a backend that decodes each verification
as a multiple of some rows, so its batches keep few shapes, must give every real row the
logits it gets unpadded, leave the cache as an unpadded decode does, and so keep answers
identical."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.decoding.drafters import ModelDrafter
from specdec_cli.decoding.engine import Finished, Generation, GenerationSettings
from specdec_cli.errors import BadUsageError
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend

CONTEXT = "the cat sat on the mat and then it went away " * 3
CONTINUATION = "the dog ran over the hill and far away"


class ChunkWidths:
    """Records the rows of each llama_decode a backend makes."""

    def __init__(self, backend: LlamaBackend) -> None:
        self.decode_chunk = backend._decode_chunk
        self.widths: list[int] = []
        backend._decode_chunk = self

    def __call__(self, chunk, n_logit_rows, invariant):
        self.widths.append(len(chunk))
        return self.decode_chunk(chunk, n_logit_rows, invariant)


def exact_backend(path, padding: int, n_ctx: int = 256) -> LlamaBackend:
    return LlamaBackend(path, n_ctx=n_ctx, n_threads=2, exact=True, verify_padding=padding)


def test_a_padded_verification_gives_each_row_its_unpadded_logits(tiny_models):
    plain, padded = (exact_backend(tiny_models.target, padding) for padding in (1, 8))
    widths = ChunkWidths(padded)
    context = plain.tokenize(CONTEXT, add_special=True)
    tokens = plain.tokenize(CONTINUATION, add_special=False)
    for backend in (plain, padded):
        backend.decode(context, 1, prompt=True)
    widths.widths.clear()
    for n in (3, 1, 8, 5):  # as a run's verifications come, each after the last
        batch = tokens[:n]
        expected = np.array(plain.decode(batch, n))
        got = np.array(padded.decode(batch, n))
        assert got.shape == expected.shape
        assert np.array_equal(got, expected)
        assert padded.cached == plain.cached  # the padding's cells are gone
        tokens = tokens[n:]
    assert widths.widths == [8, 1, 8, 8]
    assert padded.tokens_decoded - plain.tokens_decoded == 5 + 0 + 0 + 3


def test_padding_stops_at_the_end_of_the_context(tiny_models):
    padded = exact_backend(tiny_models.target, 8, n_ctx=64)
    widths = ChunkWidths(padded)
    tokens = padded.tokenize(CONTEXT * 20, add_special=True)
    assert len(tokens) > padded.n_ctx
    padded.decode(tokens[: padded.n_ctx - 4], 1, prompt=True)
    widths.widths.clear()
    padded.decode(tokens[:2], 2)
    assert widths.widths == [4]  # the room left, not 8
    assert len(padded.cached) == padded.n_ctx - 2


def test_verifications_are_padded_and_single_steps_and_prompts_are_not(tiny_models):
    """A single token is the target alone's every step: one shape already, padded it would
    cost a verification."""
    padded = exact_backend(tiny_models.target, 4)
    widths = ChunkWidths(padded)
    tokens = padded.tokenize(CONTEXT, add_special=True)
    padded.decode(tokens[:-5], 1, prompt=True)
    padded.decode(tokens[-5:-3], 2)
    padded.decode(tokens[-3:-2], 1)
    padded.decode(tokens[-2:], 1, prompt=True)  # a prompt's tail: one logit row, not padded
    assert widths.widths[-3:] == [4, 1, 2]


def test_an_answer_drafted_and_verified_in_padded_batches_is_the_target_alones(tiny_models):
    settings = GenerationSettings(max_tokens=40, draft_max=5)
    alone = exact_backend(tiny_models.target, 1)
    target = exact_backend(tiny_models.target, 8)
    widths = ChunkWidths(target)
    drafter = ModelDrafter(LlamaBackend(tiny_models.close_drafter, n_ctx=256, n_threads=2))
    prompt = alone.tokenize(CONTEXT, add_special=True)
    expected = answer(Generation(alone, prompt, settings))
    got = answer(Generation(target, prompt, settings, drafter=drafter))
    assert got == expected
    verifications = [width for width in widths.widths if 1 < width <= 8]
    assert verifications and set(verifications) == {8}


def answer(generation: Generation) -> list[int]:
    finished = [event for event in generation.events() if isinstance(event, Finished)]
    return finished[-1].tokens


def test_the_padding_is_the_backends_own_unless_set_to_measure(monkeypatch):
    monkeypatch.delenv("SPECDEC_VERIFY_PADDING", raising=False)
    assert library.verify_padding(on_gpu=False) == 1  # rows cost compute on a CPU
    monkeypatch.setenv("SPECDEC_VERIFY_PADDING", "8")
    assert library.verify_padding(on_gpu=False) == 8
    for wrong in ("eight", "0", "65"):
        monkeypatch.setenv("SPECDEC_VERIFY_PADDING", wrong)
        with pytest.raises(BadUsageError, match="SPECDEC_VERIFY_PADDING must be"):
            library.verify_padding(on_gpu=False)
