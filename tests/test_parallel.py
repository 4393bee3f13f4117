"""Several requests in one llama.cpp context (serve --parallel): each answer is the one the
request gets alone, whatever shares its passes.

Four generations run side by side on the views of one split tiny target, their generated
rows in shared rounds (models/rounds.py); each must equal the same request alone on a
backend of its own, token for token and its logits bit for bit. A barrier holds every
request until all four take part, so the first rounds really hold all four (the test
checks it). The control: the same with llama.cpp's own kernels (exact off), where the
logits part from the solo ones, so the comparison can see a difference.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from specdec_cli.decoding.backend import Decoder
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.modes import build_drafter
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.models.llama_backend import LlamaBackend

PROMPTS = [
    "the cat sat on the mat and the cat sat on the",
    "one two three four five six seven",
    "a b c d e f g a b c d e f g a b c",
    "the dog ran over the hill",
]
GREEDY = GenerationSettings(max_tokens=40, draft_max=6)
SEEDED = GenerationSettings(
    max_tokens=40, draft_max=6, sampling=SamplingSettings(temperature=0.9), seed=11
)


class Recording:
    """A decoder that keeps a copy of every logits row it returns, in order."""

    def __init__(self, inner: LlamaBackend) -> None:
        self.inner = inner
        self.rows: list[np.ndarray] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decode(self, tokens, n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        logits = self.inner.decode(tokens, n_logit_rows, prompt)
        self.rows.extend(np.array(row) for row in logits)
        return logits

    def truncate(self, n_keep: int) -> None:
        self.inner.truncate(n_keep)


def drafter_for(target: Decoder):
    # Verification priced as free: every n-gram match is drafted, so rounds verify drafts.
    return build_drafter("ngram", target, None, CostModel({1: 1.0, 64: 1.0}, 0.0, learn=False))


def generate(target: Decoder, text: str, settings: GenerationSettings):
    prompt = target.tokenize(text, add_special=True)
    return Generation(target, prompt, settings, drafter=drafter_for(target)).run()


def alone(path, text: str, settings: GenerationSettings, exact: bool):
    backend = Recording(LlamaBackend(path, n_ctx=512, n_threads=1, exact=exact))
    try:
        return generate(backend, text, settings), backend.rows
    finally:
        backend.inner.close()


def side_by_side(path, settings: GenerationSettings, exact: bool):
    """Every prompt at once on a context split four ways: (finished, logits rows) each, and
    the rounds' statistics."""
    owner = LlamaBackend(path, n_ctx=512, n_threads=1, exact=exact)
    views = owner.split(len(PROMPTS))
    rounds = views[0].rounds
    assert rounds is not None
    everyone_in = threading.Barrier(len(PROMPTS))
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def answer(seq: int) -> None:
        view = Recording(views[seq])
        try:
            with rounds.taking_part(seq):
                rounds.join(seq)  # takes part from the start: the first rounds hold all four
                everyone_in.wait()
                results[seq] = (generate(view, PROMPTS[seq], settings), view.rows)
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            everyone_in.abort()

    threads = [threading.Thread(target=answer, args=(seq,)) for seq in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owner.close()
    if errors:
        raise errors[0]
    return [results[seq] for seq in range(len(PROMPTS))], rounds.stats


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_four_requests_side_by_side_answer_as_each_alone(tiny_models, settings):
    together, stats = side_by_side(tiny_models.target, settings, exact=True)
    assert stats.largest == len(PROMPTS)  # the four shared passes
    assert stats.rows > stats.rounds * len(PROMPTS)  # drafts were verified in them
    for text, (finished, rows) in zip(PROMPTS, together, strict=True):
        solo, solo_rows = alone(tiny_models.target, text, settings, exact=True)
        assert finished.tokens == solo.tokens
        assert len(rows) == len(solo_rows)
        assert all(np.array_equal(a, b) for a, b in zip(rows, solo_rows, strict=True))


def test_the_control_llama_cpps_own_kernels_part_from_the_solo_logits(tiny_models):
    together, stats = side_by_side(tiny_models.target, GREEDY, exact=False)
    assert stats.largest == len(PROMPTS)
    differing = 0
    for text, (_, rows) in zip(PROMPTS, together, strict=True):
        _, solo_rows = alone(tiny_models.target, text, GREEDY, exact=False)
        common = min(len(rows), len(solo_rows))
        differing += sum(not np.array_equal(rows[i], solo_rows[i]) for i in range(common))
    assert differing > 0
