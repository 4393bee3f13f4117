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
from specdec_cli.llama.backend import LlamaBackend

PROMPTS = [
    "the cat sat on the mat and the cat sat on the",
    "one two three four five six seven",
    "a b c d e f g a b c d e f g a b c",
    "the dog ran over the hill",
]
EVERY = tuple(range(len(PROMPTS)))
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


def at_once(rounds, seqs, work) -> dict:
    """`work(seq)` on a thread per sequence of `seqs`, each taking part in `rounds` from the
    start (a barrier holds them until all do, so the first rounds hold them all): what
    each returned, by sequence; the first error raised again."""
    everyone_in = threading.Barrier(len(seqs))
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(seq: int) -> None:
        try:
            with rounds.taking_part(seq):
                rounds.join(seq)
                everyone_in.wait()
                results[seq] = work(seq)
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            everyone_in.abort()

    threads = [threading.Thread(target=one, args=(seq,)) for seq in seqs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def side_by_side(
    path, settings: GenerationSettings, exact: bool, taking_part=EVERY, idle=(), pass_cost=None
):
    """The prompts of the sequences `taking_part` at once on a context split four ways:
    (finished, logits rows) each, and the rounds' statistics. The `idle` sequences first
    decode their prompt and then wait, a slot keeping an earlier request's cache; after the
    others, each generates from it: (finished, rows) too. `pass_cost`: split's."""
    owner = LlamaBackend(path, n_ctx=512, n_threads=1, exact=exact)
    views = owner.split(len(PROMPTS), pass_cost)
    rounds = views[0].rounds
    assert rounds is not None
    waiting = {seq: Recording(views[seq]) for seq in idle}
    prompts = {seq: views[seq].tokenize(PROMPTS[seq], add_special=True) for seq in idle}
    for seq, view in waiting.items():
        view.decode(prompts[seq], 1, prompt=True)

    def answer(seq: int) -> tuple:
        view = Recording(views[seq])
        return generate(view, PROMPTS[seq], settings), view.rows

    try:
        results = at_once(rounds, taking_part, answer)
        for seq, view in waiting.items():
            results[seq] = (Generation(view, prompts[seq], settings).run(), view.rows)
    finally:
        owner.close()
    return [results[seq] for seq in sorted(results)], rounds.stats


def rows_cost_their_count(rows: int) -> float:
    """A pass's cost by which a round whose parts differ in width is always left ragged."""
    return float(rows)


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_four_requests_side_by_side_answer_as_each_alone(tiny_models, settings):
    padded, padded_stats = side_by_side(tiny_models.target, settings, exact=True)
    ragged, ragged_stats = side_by_side(
        tiny_models.target, settings, exact=True, pass_cost=rows_cost_their_count
    )
    for stats in (padded_stats, ragged_stats):
        assert stats.largest == len(PROMPTS)  # the four shared passes
        assert stats.rows > stats.rounds * len(PROMPTS)  # drafts were verified in them
    # Parts of different widths: padded to the widest, or ragged (only the sequences
    # between a round's get padding then).
    assert ragged_stats.padding < padded_stats.padding
    for i, text in enumerate(PROMPTS):
        solo, solo_rows = alone(tiny_models.target, text, settings, exact=True)
        for finished, rows in (padded[i], ragged[i]):
            assert finished.tokens == solo.tokens
            assert len(rows) == len(solo_rows)
            assert all(np.array_equal(a, b) for a, b in zip(rows, solo_rows, strict=True))


def test_sequences_with_idle_ones_between_them_answer_as_alone_and_leave_those_whole(
    tiny_models,
):
    # 0 and 3 share rounds; 1 and 2 (a slot keeping a cache, and one never used) get the
    # padding rows that keep the round one graph compute, removed again.
    together, stats = side_by_side(
        tiny_models.target, GREEDY, exact=True, taking_part=(0, 3), idle=(1,)
    )
    assert stats.largest == 2
    for seq, (finished, rows) in zip((0, 3), (together[0], together[2]), strict=True):
        solo, solo_rows = alone(tiny_models.target, PROMPTS[seq], GREEDY, exact=True)
        assert finished.tokens == solo.tokens, seq
        assert all(np.array_equal(a, b) for a, b in zip(rows, solo_rows, strict=True))
    # The idle one, as the same calls on a backend of its own.
    backend = Recording(LlamaBackend(tiny_models.target, n_ctx=512, n_threads=1, exact=True))
    prompt = backend.tokenize(PROMPTS[1], add_special=True)
    backend.decode(prompt, 1, prompt=True)
    solo = Generation(backend, prompt, GREEDY).run()
    backend.inner.close()
    finished, rows = together[1]
    assert finished.tokens == solo.tokens
    assert all(np.array_equal(a, b) for a, b in zip(rows, backend.rows, strict=True))


def test_the_control_llama_cpps_own_kernels_part_from_the_solo_logits(tiny_models):
    together, stats = side_by_side(tiny_models.target, GREEDY, exact=False)
    assert stats.largest == len(PROMPTS)
    differing = 0
    for text, (_, rows) in zip(PROMPTS, together, strict=True):
        _, solo_rows = alone(tiny_models.target, text, GREEDY, exact=False)
        common = min(len(rows), len(solo_rows))
        differing += sum(not np.array_equal(rows[i], solo_rows[i]) for i in range(common))
    assert differing > 0


def test_the_slots_drafters_step_together_and_every_answer_stays_its_own(tiny_models):
    # Four requests, each drafted for by a sequence of one split drafter context whose
    # steps join the target's rounds as a pool of their own (the classic loop: a draft of
    # six every round, so the four draft at the same time).
    owner = LlamaBackend(tiny_models.target, n_ctx=512, n_threads=1, exact=True)
    draft_owner = LlamaBackend(tiny_models.close_drafter, n_ctx=512, n_threads=1)
    views = owner.split(len(PROMPTS))
    rounds = views[0].rounds
    assert rounds is not None
    draft_views = draft_owner.split(len(PROMPTS), rounds=rounds)

    def answer(seq: int) -> list[int]:
        view = views[seq]
        prompt = view.tokenize(PROMPTS[seq], add_special=True)
        drafter = build_drafter("fixed", view, draft_views[seq])
        return Generation(view, prompt, GREEDY, drafter=drafter).run().tokens

    try:
        results = at_once(rounds, EVERY, answer)
    finally:
        owner.close()
        draft_owner.close()
    assert rounds.stats.drafter_parts > rounds.stats.drafter_rounds > 0  # steps shared
    for seq, text in enumerate(PROMPTS):
        solo, _ = alone(tiny_models.target, text, GREEDY, exact=True)
        assert results[seq] == solo.tokens
