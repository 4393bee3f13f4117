"""The adaptive planner: its cost table, learned rates and choice of draft length."""

from __future__ import annotations

import pytest
from fakes import FakeBackend, scripted_model

from specdec_cli.adaptive import (
    AcceptanceModel,
    AdaptiveDrafter,
    CostModel,
    ProbeSchedule,
    Rate,
    expected_tokens,
    measure_costs,
)
from specdec_cli.drafters import Draft, ModelDrafter, NgramDrafter
from specdec_cli.sampling import Distribution, GumbelChooser, SamplingSettings

GREEDY = SamplingSettings(temperature=0.0)
N_VOCAB = 32


# --- costs -----------------------------------------------------------------------------------


def test_verify_costs_interpolate_between_measured_sizes():
    costs = CostModel({1: 1.0, 2: 1.5, 4: 2.0, 8: 6.0}, draft_step=0.1)
    assert [costs.verify(n) for n in (1, 2, 3, 4, 6, 8)] == pytest.approx(
        [1.0, 1.5, 1.75, 2.0, 4.0, 6.0]
    )


def test_verify_costs_continue_the_last_slope_beyond_the_table():
    costs = CostModel({1: 1.0, 4: 2.0, 8: 6.0}, draft_step=0.1)
    assert costs.verify(10) == pytest.approx(8.0)
    assert costs.verify(100) == pytest.approx(98.0)  # past the first dense table of 64


def test_one_learned_overhead_shifts_every_size_alike():
    costs = CostModel({1: 1.0, 8: 3.0}, draft_step=0.1)
    for _ in range(200):
        costs.observe_verify(1, 1.5)  # every round takes half a second longer than measured
    assert costs.overhead == pytest.approx(0.5, abs=1e-3)
    assert costs.verify(8) == pytest.approx(3.5, abs=1e-3)


def test_draft_step_follows_the_measured_steps():
    costs = CostModel({1: 1.0}, draft_step=0.1)
    for _ in range(200):
        costs.observe_draft_step(0.3)
    assert costs.draft_step == pytest.approx(0.3, abs=1e-3)


def test_fixed_costs_learn_nothing():
    costs = CostModel({1: 1.0}, draft_step=0.1, learn=False)
    costs.observe_verify(1, 5.0)
    costs.observe_draft_step(5.0)
    assert (costs.verify(1), costs.draft_step) == (1.0, 0.1)


def test_measuring_times_each_size_that_fits_and_leaves_the_caches_empty():
    target = FakeBackend(scripted_model(lambda p: 1, N_VOCAB), N_VOCAB, n_ctx=512)
    drafter = target.twin()
    costs = measure_costs(target, drafter, [t % N_VOCAB for t in range(40)])
    assert sorted(costs.verify_seconds) == [1, 2, 4, 8, 16, 32]
    assert all(seconds > 0 for seconds in costs.verify_seconds.values())
    assert costs.draft_step > 0
    assert target.cached == [] and drafter.cached == []


# --- learned acceptance ------------------------------------------------------------------------


def test_a_rate_starts_at_its_prior_and_follows_recent_outcomes():
    rate = Rate(0.5)
    assert rate.value == 0.5
    for _ in range(200):
        rate.update(True)
    assert rate.value > 0.99
    for _ in range(200):
        rate.update(False)
    assert rate.value < 0.01  # old hits are forgotten


def model_draft(confidences: list[float]) -> Draft:
    tokens = list(range(len(confidences)))
    return Draft(tokens, [Distribution.point(t) for t in tokens], "model", confidences)


def test_model_drafts_teach_the_confidence_buckets_up_to_the_first_rejection():
    acceptance = AcceptanceModel()
    sure, unsure = acceptance.for_confidence(0.99), acceptance.for_confidence(0.1)
    before = (sure.total, unsure.total, sure.value)
    acceptance.learn(model_draft([0.99, 0.99, 0.1]), n_accepted=1)
    # Token 1 was kept, token 2 rejected, token 3 never judged.
    assert sure.total == pytest.approx((before[0] * 0.97 + 1) * 0.97 + 1)
    assert unsure.total == before[1]
    assert acceptance.model_first.value > 0.6


def test_ngram_drafts_teach_the_first_token_by_match_length_and_the_rest_together():
    acceptance = AcceptanceModel()
    draft = Draft([5, 6, 7], [Distribution.point(t) for t in (5, 6, 7)], "ngram", match_length=9)
    long_match, following = acceptance.for_ngram(9), acceptance.ngram_next
    first_before, next_before = long_match.value, following.value
    acceptance.learn(draft, n_accepted=3)
    assert acceptance.for_ngram(5) is long_match  # 5 and longer share one rate
    assert long_match.value > first_before and following.value > next_before
    assert acceptance.for_ngram(1).value == 0.2  # other lengths untouched


def test_expected_tokens_counts_the_targets_own_token_and_each_survivor():
    assert expected_tokens(0.9, 0.9, 0) == 1.0
    assert expected_tokens(1.0, 1.0, 3) == 4.0
    assert expected_tokens(0.5, 0.5, 2) == pytest.approx(1 + 0.5 * (1 + 0.5))


def test_an_unpaid_probe_waits_twice_as_long_and_a_paid_one_starts_over():
    probes = ProbeSchedule(first=2, longest=6)
    waits = []
    for _ in range(3):
        waited = 0
        while not probes.due():
            probes.skipped()
            waited += 1
        probes.probed()
        waits.append(waited)
    assert waits == [2, 4, 6]
    probes.paid()
    assert probes.interval == 2 and probes.waited == 0


# --- the choice of draft --------------------------------------------------------------------

# A text copying itself: its ending matched 10 tokens back, so n-gram drafts look sure.
COPYING = [*range(10, 20), *range(10, 17)]
# "1 2" occurred twice before the ending "1 2": first followed by 10, then by 11.
TWICE = [1, 2, 10, 12, 1, 2, 11, 9, 1, 2]


def ngram_only(verify_seconds: dict[int, float]) -> AdaptiveDrafter:
    return AdaptiveDrafter(CostModel(verify_seconds, 0.0, learn=False), ngram=NgramDrafter())


def propose(drafter: AdaptiveDrafter, context: list[int], max_tokens: int = 8) -> Draft:
    return drafter.propose(context, max_tokens, GREEDY, GumbelChooser(0))


def test_free_verification_drafts_as_many_tokens_as_allowed():
    draft = propose(ngram_only({1: 1.0, 32: 1.0}), COPYING, max_tokens=8)
    assert draft.source == "ngram" and draft.tokens == [17, 18, 19, 10, 11, 12, 13, 14]


def test_the_draft_length_with_the_most_tokens_per_second_is_chosen():
    # Verifying up to 4 tokens costs little more than one; a fifth costs much more.
    draft = propose(ngram_only({1: 1.0, 2: 1.1, 4: 1.3, 8: 4.0}), [*COPYING, 17, 18])
    assert draft.source == "ngram" and len(draft.tokens) == 3


def test_verification_that_costs_a_step_per_token_drafts_nothing():
    assert propose(ngram_only({1: 1.0, 2: 2.0, 8: 8.0}), TWICE).tokens == []


def test_planning_a_draft_that_is_not_proposed_leaves_the_index_alone():
    drafter = ngram_only({1: 1.0, 2: 2.0, 8: 8.0})
    propose(drafter, TWICE)
    assert drafter.ngram.index.lookup(3).tokens[0] == 10  # still the first occurrence


def test_a_proposed_ngram_draft_moves_on_to_the_next_occurrence():
    drafter = ngram_only({1: 1.0, 32: 1.0})
    assert propose(drafter, TWICE).tokens[0] == 10
    assert propose(drafter, TWICE).tokens[0] == 11


def confident_model_drafter(verify_seconds: dict[int, float]) -> AdaptiveDrafter:
    """A drafter model that is always sure (so each token is kept with probability 0.97)."""
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    model = ModelDrafter(FakeBackend(counting, N_VOCAB))
    return AdaptiveDrafter(CostModel(verify_seconds, 0.01, learn=False), model=model)


def test_a_model_draft_grows_while_verification_stays_cheap():
    draft = propose(confident_model_drafter({1: 1.0, 32: 1.0}), [1, 2, 3], max_tokens=6)
    assert draft.source == "model" and draft.tokens == [4, 5, 6, 7, 8, 9]


def test_a_model_draft_stops_where_its_next_token_costs_more_than_it_brings():
    # Verifying 5 tokens costs twice as much as 4: a 4th draft token would not pay.
    draft = propose(confident_model_drafter({1: 1.0, 4: 1.0, 8: 5.0}), [1, 2, 3], max_tokens=6)
    assert draft.tokens == [4, 5, 6]
