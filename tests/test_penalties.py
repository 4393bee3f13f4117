"""OpenAI's frequency and presence penalties (decoding/penalties.py): each row lowered by the
answer's own token counts up to its position, so that the answer with a drafter is the
target alone's with the same penalties, and both are what the penalised logits choose."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from fakes import GREEDY, SAMPLED, FixedDrafter, model_drafter, table_target

from specdec_cli.decoding.drafters import ModelDrafter, NgramDrafter
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.penalties import Penalties
from specdec_cli.llama.backend import LlamaBackend

PROMPT = [0, 1, 2]
PENALTIES = Penalties(frequency=0.7, presence=0.4)


def answer(target, settings, drafter=None, prompt=PROMPT) -> list[int]:
    return Generation(target, prompt, settings, drafter).run().tokens


def reference_greedy(
    logits_fn, penalties: Penalties, n: int, bias: dict[int, float] | None = None
) -> list[int]:
    """One token at a time, each logit lowered by the counts so far and moved by its bias."""
    tokens: list[int] = []
    for _ in range(n):
        row = np.asarray(logits_fn(tuple(PROMPT + tokens)), dtype=np.float64)
        for token, times in Counter(tokens).items():
            row[token] -= penalties.frequency * times + penalties.presence
        for token, amount in (bias or {}).items():
            row[token] += amount
        tokens.append(int(np.argmax(row)))
    return tokens


@pytest.mark.parametrize("drafter", [None, "fixed", "model", "ngram"])
def test_greedy_penalised_answers_are_the_penalised_logits_choices(drafter):
    target = table_target()
    drafters = {
        None: None,
        "fixed": FixedDrafter([4, 5, 6]),
        "model": model_drafter(target),
        "ngram": NgramDrafter(),
    }
    settings = GenerationSettings(max_tokens=40, draft_max=4, sampling=GREEDY, penalties=PENALTIES)
    expected = reference_greedy(target.logits_fn, PENALTIES, 40)
    assert answer(target, settings, drafters[drafter]) == expected
    unpenalised = GenerationSettings(max_tokens=40, draft_max=4, sampling=GREEDY)
    assert answer(table_target(), unpenalised) != expected  # the penalties changed it


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_sampled_penalised_answers_are_the_same_with_a_drafter(seed):
    settings = GenerationSettings(
        max_tokens=40, draft_max=5, sampling=SAMPLED, seed=seed, penalties=PENALTIES
    )
    alone = answer(table_target(), settings)
    target = table_target()
    assert answer(target, settings, model_drafter(target)) == alone
    assert (
        answer(table_target(), GenerationSettings(max_tokens=40, sampling=SAMPLED, seed=seed))
        != alone
    )


def test_a_strong_presence_penalty_repeats_no_token_while_others_are_left():
    settings = GenerationSettings(max_tokens=10, sampling=GREEDY, penalties=Penalties(presence=100))
    tokens = answer(table_target(), settings, FixedDrafter([4, 5, 6]))
    assert sorted(tokens) == list(range(10))


def test_each_verified_row_counts_the_draft_before_it():
    rows = np.zeros((3, 5), dtype=np.float32)
    penalised = Penalties(frequency=1.0, presence=0.5).rows(rows, Counter({1: 2}), [1, 3])
    assert penalised.tolist() == [
        [0.0, -2.5, 0.0, 0.0, 0.0],  # the answer's two 1s
        [0.0, -3.5, 0.0, 0.0, 0.0],  # and the draft's 1
        [0.0, -3.5, 0.0, -1.5, 0.0],  # and its 3
    ]
    assert rows.tolist() == np.zeros((3, 5)).tolist()  # the rows themselves are left as read


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_drafter_changes_no_penalised_answer_in_exact_mode(tiny_models, sampling):
    def backend(path) -> LlamaBackend:
        return LlamaBackend(path, n_ctx=256, n_threads=2, exact=True)

    settings = GenerationSettings(
        max_tokens=48, draft_max=6, sampling=sampling, seed=3, penalties=PENALTIES
    )
    # the soft pair: margins narrow enough for penalties to change the answer
    target, drafter = backend(tiny_models.soft_target), backend(tiny_models.soft_drafter)
    try:
        prompt = target.tokenize("the cat sat on the mat and", add_special=True)
        alone = Generation(target, prompt, settings).run()
        target.truncate(0)
        drafted = Generation(target, prompt, settings, ModelDrafter(drafter)).run()
        target.truncate(0)
        plain = Generation(
            target, prompt, GenerationSettings(max_tokens=48, sampling=sampling, seed=3)
        ).run()
    finally:
        target.close()
        drafter.close()
    assert drafted.tokens == alone.tokens != plain.tokens
    assert drafted.stats.accepted > 5


# ---- logit_bias ------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", [None, "fixed", "model"])
def test_biased_answers_are_the_biased_logits_choices(drafter):
    target = table_target()
    plain = answer(table_target(), GenerationSettings(max_tokens=30, sampling=GREEDY))
    bias = {plain[0]: -100.0, plain[1]: 3.0}  # the first choice banned, the second favoured
    drafters = {None: None, "fixed": FixedDrafter(plain[:4]), "model": model_drafter(target)}
    settings = GenerationSettings(
        max_tokens=30, draft_max=4, sampling=GREEDY, logit_bias=tuple(bias.items()),
        penalties=PENALTIES,
    )  # fmt: skip
    tokens = answer(target, settings, drafters[drafter])
    assert tokens == reference_greedy(target.logits_fn, PENALTIES, 30, bias)
    assert plain[0] not in tokens
