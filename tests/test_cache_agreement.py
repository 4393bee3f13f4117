"""decoding.backend.CacheAgreement: a caller that comes back to logits_for_suffix with its
tokens grown is compared with the cache only from where it left, while a cache that anyone
else changed, or tokens the caller changed, are compared again; the engine's target and a
model drafter each keep one."""

from __future__ import annotations

import numpy as np
from fakes import ComparisonsCounted, FakeBackend, scripted_model, table_model

from specdec_cli.decoding.backend import CacheAgreement, logits_for_suffix
from specdec_cli.decoding.drafters import ModelDrafter
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.sampling import GumbelChooser, SamplingSettings

N_VOCAB = 10
GREEDY = SamplingSettings()
TOKENS = [(3 * i + 1) % N_VOCAB for i in range(30)]


def model():
    return table_model(N_VOCAB, seed=5, context=3)


def wrong_every_third_token(prefix: tuple[int, ...]) -> np.ndarray:
    """A drafter for model(): right twice, then wrong."""
    row = model()(prefix)
    return -row if len(prefix) % 3 == 0 else row


def fresh_rows(tokens: list[int], n_rows: int) -> np.ndarray:
    return FakeBackend(model(), N_VOCAB).decode(tokens, n_rows)


def agreed_backend(tokens: list[int]) -> tuple[ComparisonsCounted, CacheAgreement]:
    """A backend that held a part of `tokens` from before, then one call with an agreement."""
    backend = ComparisonsCounted(model(), N_VOCAB)
    backend.decode(tokens[:5], 1)
    agreement = CacheAgreement()
    logits_for_suffix(backend, tokens, 1, agreement=agreement)
    return backend, agreement


def test_tokens_grown_since_the_last_call_are_compared_from_there():
    tokens = TOKENS[:20]
    backend, agreement = agreed_backend(tokens)
    assert backend.comparisons == 1
    for end in (22, 25, 30):
        rows = logits_for_suffix(backend, TOKENS[:end], 2, agreement=agreement)
        np.testing.assert_array_equal(rows, fresh_rows(TOKENS[:end], 2))
    assert backend.comparisons == 1


def test_a_cache_another_caller_changed_is_compared_again():
    tokens = TOKENS[:20]
    backend, agreement = agreed_backend(tokens)
    backend.truncate(10)  # another caller: the same length again, other tokens
    backend.decode([(t + 1) % N_VOCAB for t in tokens[10:]], 1)
    rows = logits_for_suffix(backend, TOKENS[:22], 1, agreement=agreement)
    np.testing.assert_array_equal(rows, fresh_rows(TOKENS[:22], 1))
    assert backend.comparisons == 2


def test_a_cache_replaced_by_another_list_is_compared_again():
    # as a restored prompt-cache state is: a new list, the count unmoved
    tokens = TOKENS[:20]
    backend, agreement = agreed_backend(tokens)
    backend.cached = [(t + 1) % N_VOCAB for t in tokens]
    rows = logits_for_suffix(backend, TOKENS[:22], 1, agreement=agreement)
    np.testing.assert_array_equal(rows, fresh_rows(TOKENS[:22], 1))
    assert backend.comparisons == 2


def test_tokens_the_caller_changed_are_compared_from_where_it_says():
    tokens = list(TOKENS[:20])
    backend, agreement = agreed_backend(tokens)
    tokens[12:] = [(t + 1) % N_VOCAB for t in tokens[12:]]
    agreement.changed_from(12)
    rows = logits_for_suffix(backend, tokens, 3, agreement=agreement)
    np.testing.assert_array_equal(rows, fresh_rows(tokens, 3))
    assert backend.comparisons == 1 and backend.cached == tokens


def test_an_answer_compares_the_context_with_the_targets_cache_once():
    # the prompt's pass compares it; each round after only the draft's tokens
    target = ComparisonsCounted(model(), N_VOCAB)
    prompt = TOKENS[:20]
    target.decode(prompt[:8], 1)  # an earlier request's
    drafter = ModelDrafter(FakeBackend(wrong_every_third_token, N_VOCAB))
    settings = GenerationSettings(max_tokens=40, draft_max=4)
    done = Generation(target, prompt, settings, drafter).run()
    alone = Generation(FakeBackend(model(), N_VOCAB), prompt, settings).run()
    assert done.tokens == alone.tokens
    assert done.stats.target_passes > 10 and done.stats.accepted < done.stats.drafted
    assert target.comparisons == 1


def test_a_model_drafter_compares_the_growing_context_with_its_cache_once():
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    backend = ComparisonsCounted(counting, N_VOCAB)
    drafter = ModelDrafter(backend)
    context = [t % N_VOCAB for t in range(20)]  # the engine's one growing list
    backend.decode(context[:5], 1)
    for accepted in (2, 0, 3):
        draft = drafter.propose(context, 4, GREEDY, GumbelChooser(0))
        assert draft.tokens == [(context[-1] + k) % N_VOCAB for k in range(1, 5)]
        # the target kept `accepted` of them, then its own token (here another one)
        context += [*draft.tokens[:accepted], (draft.tokens[accepted] + 5) % N_VOCAB]
    assert backend.comparisons == 1
    # another list is copied and compared whole, and drafts after its own tokens
    other = [t % N_VOCAB for t in range(3, 30)]
    assert drafter.propose(other, 2, GREEDY, GumbelChooser(0)).tokens == [0, 1]
    assert backend.comparisons == 2
