"""The adaptive planner: its cost table, learned rates and choice of draft length."""

from __future__ import annotations

import time
from dataclasses import astuple

import numpy as np
import pytest
from fakes import (
    ComparisonsCounted,
    FakeBackend,
    ScriptedClock,
    TimedBackend,
    gpu_like_drafter,
    scripted_model,
    sequence_model,
    table_cost,
    table_model,
)

from specdec_cli.decoding.adaptive import AdaptiveDrafter, ProbeSchedule
from specdec_cli.decoding.costs import (
    CatchUpPrice,
    CostModel,
    ProbeTimings,
    measure_costs,
    probe_problems,
    shared_pass_costs,
)
from specdec_cli.decoding.drafters import (
    Draft,
    DraftSource,
    ModelDrafter,
    NgramDrafter,
    Outcome,
    ngram_draft,
)
from specdec_cli.decoding.engine import Generation, GenerationSettings, Round
from specdec_cli.decoding.learned_rates import AcceptanceModel, Rate, expected_tokens
from specdec_cli.decoding.modes import build_drafter
from specdec_cli.decoding.policy import (
    CATCH_UP_COST,
    CATCH_UP_LEARN_MIN,
    FORCED_FIRST_PRIOR,
    MIN_ROW_SHARE,
    MODEL_PROBE_TOKENS,
    NGRAM_FIRST_PRIORS,
    NGRAM_NEXT_PRIORS,
    PROBE_BUDGET,
)
from specdec_cli.decoding.sampling import (
    Distribution,
    GumbelChooser,
    SamplingSettings,
    top_probability,
)

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


def test_a_measured_size_costs_the_median_of_its_recent_decodes():
    costs = CostModel({1: 1.0, 8: 3.0}, draft_step=0.1)
    for seconds in (1.5, 1.4, 9.0, 1.6, 1.5):  # one decode slowed by something else
        costs.observe_verify(1, seconds)
    assert costs.verify(1) == pytest.approx(1.5)


def test_a_measured_size_rescales_the_sizes_around_it():
    # The start table prices 2 tokens and more at three times their cost.
    costs = CostModel({1: 1.0, 2: 6.0, 4: 12.0, 8: 24.0}, draft_step=0.1)
    costs.observe_verify(1, 1.0)
    costs.observe_verify(4, 4.0)  # a third of the table's price
    assert costs.verify(4) == pytest.approx(4.0)
    assert costs.verify(8) == pytest.approx(8.0)  # beyond: the nearest measured ratio
    assert costs.verify(32) == pytest.approx(32.0)
    assert costs.verify(2) == pytest.approx(6.0 * (1.0 + (1 / 3 - 1.0) / 3))  # between


def test_one_measurement_makes_no_size_free_or_hopeless():
    costs = CostModel({1: 1.0, 8: 3.0}, draft_step=0.1)
    costs.observe_verify(1, 1000.0)
    assert costs.verify(8) == pytest.approx(30.0)  # at most ten times the table
    costs.observe_verify(1, 0.0)  # not a timing: ignored
    assert costs.verify(1) == pytest.approx(10.0)


def test_a_fresh_copy_starts_from_the_same_table_and_a_healed_one_from_what_was_learned():
    costs = CostModel({1: 1.0, 8: 6.0}, draft_step=0.1)
    costs.observe_verify(8, 3.0)
    costs.observe_draft_step(0.2)
    fresh, healed = costs.fresh(), costs.healed()
    assert (fresh.verify(8), fresh.draft_step, fresh.decodes_observed) == (6.0, 0.1, 0)
    assert healed.verify(8) == pytest.approx(3.0) and healed.draft_step == 0.2
    assert costs.as_dict()["started"]["target_decode_ms"]["8"] == 6000.0
    assert costs.as_dict()["now"]["target_decode_ms"]["8"] == 3000.0
    assert costs.as_dict()["observed"] == {"8": 1}


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


# A quiet machine's costs (a healthy probe of the default pair in the issue that asked for
# healing, extended to 32), and the same table probed while something else ran: every size
# of 2 tokens or more three times as dear.
QUIET = {1: 0.046, 2: 0.060, 4: 0.101, 8: 0.189, 16: 0.300, 32: 0.560}
POISONED = {n: s if n == 1 else 3 * s for n, s in QUIET.items()}
DRAFT_STEP = 0.020


@pytest.fixture
def clock(monkeypatch) -> ScriptedClock:
    """time.perf_counter, as the engine, the drafters and the probe read it, moves only when
    a TimedBackend decodes."""
    clock = ScriptedClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def timed_pair(clock: ScriptedClock, costs: dict[int, float], logits=None, n_ctx: int = 512):
    logits = logits or scripted_model(lambda p: 1, N_VOCAB)
    target = TimedBackend(logits, N_VOCAB, clock, table_cost(costs), n_ctx=n_ctx)
    drafter = TimedBackend(logits, N_VOCAB, clock, lambda n: DRAFT_STEP * n, n_ctx=n_ctx)
    return target, drafter


PROBE = [t % N_VOCAB for t in range(40)]


def test_a_quiet_probe_passes_its_checks_and_is_trusted(clock):
    costs = measure_costs(*timed_pair(clock, QUIET), PROBE)
    assert costs.trusted and costs.origin == "probe"
    assert costs.verify_seconds == pytest.approx(QUIET)
    assert costs.draft_step == pytest.approx(DRAFT_STEP)


def test_a_probe_that_fails_twice_is_untrusted_and_starts_from_a_conservative_table(clock):
    costs = measure_costs(*timed_pair(clock, POISONED), PROBE)
    assert not costs.trusted and "cost more than 2 one-token decodes" in costs.origin
    # Each size capped at as many one-token decodes: no length starts out hopeless.
    assert costs.verify_seconds == pytest.approx(
        {n: min(s, n * 0.046) for n, s in POISONED.items()}
    )


def test_a_probe_that_fails_once_is_taken_again(clock):
    decodes = iter(range(10**6))
    busy = lambda n: table_cost(POISONED if next(decodes) < 12 else QUIET)(n)  # noqa: E731
    target, drafter = timed_pair(clock, QUIET)
    target.cost = busy
    costs = measure_costs(target, drafter, PROBE)
    assert costs.trusted and costs.origin == "probe, second try"
    assert costs.verify_seconds == pytest.approx(QUIET)


@pytest.mark.parametrize(
    ("samples", "problem"),
    [
        ({1: [0.03, 0.06], 2: [0.06, 0.06]}, "1 tokens: repeated timings disagree (30/60 ms)"),
        ({1: [0.03, 0.03], 2: [0.08, 0.08]}, "2 tokens cost more than 2 one-token decodes"),
        ({1: [0.03, 0.03], 4: [0.1, 0.1], 8: [0.08, 0.08]}, "8 tokens cost less than 4"),
    ],
)
def test_probe_checks(samples, problem):
    assert probe_problems(ProbeTimings(samples, [])) == [problem]
    assert probe_problems(ProbeTimings({1: [0.03, 0.031], 2: [0.06, 0.062]}, [0.02])) == []


def test_a_probe_prices_a_drafters_catch_up_as_a_line_through_two_sizes(clock):
    target, drafter = timed_pair(clock, QUIET)
    drafter.cost = gpu_like_drafter  # a CPU's constant would price each token at 8 ms
    costs = measure_costs(target, drafter, [t % N_VOCAB for t in range(80)])
    assert costs.trusted and costs.draft_step == pytest.approx(DRAFT_STEP)
    assert astuple(costs.catch_up_price) == pytest.approx((0.004, 0.001))
    assert costs.catch_up(200) == pytest.approx(gpu_like_drafter(201) - DRAFT_STEP)
    assert costs.fresh().catch_up_price == costs.healed().catch_up_price == costs.catch_up_price


def test_a_catch_up_is_priced_at_the_cpus_constant_until_measured():
    # too short a probe text to time one (PROBE: 8 tokens of context)
    costs = CostModel({1: 1.0}, draft_step=0.1)
    assert costs.catch_up_price is None
    assert costs.catch_up(10) == pytest.approx(10 * 0.1 * CATCH_UP_COST)
    assert costs.catch_up(0) == 0.0


def test_the_run_learns_the_catch_up_price_per_token_from_its_large_catch_ups():
    costs = CostModel({1: 1.0}, draft_step=0.1, catch_up_price=CatchUpPrice(0.01, 0.05))
    costs.observe_catch_up(CATCH_UP_LEARN_MIN - 1, 0.1 + 0.5)  # a few tokens: their shape's
    assert costs.catch_up_price == CatchUpPrice(0.01, 0.05)
    for _ in range(3):
        costs.observe_catch_up(200, 0.1 + 0.01 + 200 * 0.002)  # a prompt: 2 ms a token
    assert astuple(costs.catch_up_price) == pytest.approx((0.01, 0.002))
    assert costs.as_dict()["now"]["catch_up"] == {"fixed_ms": 10.0, "token_ms": 2.0}
    assert costs.as_dict()["started"]["catch_up"] == {"fixed_ms": 10.0, "token_ms": 50.0}
    fixed = CostModel({1: 1.0}, draft_step=0.1, learn=False)
    fixed.observe_catch_up(200, 0.5)
    assert fixed.catch_up_price is None


def test_pooled_costs_learn_the_catch_ups_of_the_runs_they_absorb():
    pooled = CostModel({1: 1.0}, draft_step=0.1)  # unmeasured: priced at CATCH_UP_COST
    run = CostModel({1: 1.0}, draft_step=0.1, catch_up_price=CatchUpPrice(0.01, 0.05))
    run.observe_catch_up(200, 0.1 + 0.01 + 200 * 0.002)
    pooled.absorb(run)
    assert astuple(pooled.catch_up_price) == pytest.approx((0.01, 0.002))


def test_a_model_drafters_catch_up_is_timed_and_learned_by_the_run(clock):
    # The drafter reads the 60-token prompt in one decode before its first draft: that
    # decode teaches the table a token's price, the plain steps after it the step's.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    target, drafter = timed_pair(clock, {1: 1.0, 8: 1.0}, counting)
    drafter.cost = lambda n: DRAFT_STEP + 0.001 * (n - 1)
    costs = CostModel({1: 1.0, 8: 1.0}, 0.05)
    planner = AdaptiveDrafter(costs, model=ModelDrafter(drafter), probe_budget=float("inf"))
    prompt = [(7 * i) % N_VOCAB for i in range(60)]
    Generation(target, prompt, GenerationSettings(max_tokens=16), planner).run()
    assert drafter.decode_calls > 2  # it drafted
    assert astuple(costs.catch_up_price) == pytest.approx((0.0, 0.001))
    assert costs.draft_step == pytest.approx(DRAFT_STEP)


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


def test_ngram_drafts_teach_the_first_token_and_the_rest_by_match_length():
    acceptance = AcceptanceModel()
    draft = Draft([5, 6, 7], [Distribution.point(t) for t in (5, 6, 7)], "ngram", match_length=9)
    long_match, following = acceptance.for_ngram(9), acceptance.ngram_next(9)
    first_before, next_before = long_match.value, following.value
    acceptance.learn(draft, n_accepted=3)
    assert acceptance.for_ngram(8) is long_match  # 8 to 11 share one bucket
    assert acceptance.ngram_next(11) is following
    assert long_match.value > first_before and following.value > next_before
    # Other lengths untouched: a copy's long matches say nothing of chance short ones.
    assert acceptance.for_ngram(2).value == NGRAM_FIRST_PRIORS[1]
    assert acceptance.ngram_next(2).value == NGRAM_NEXT_PRIORS[1]
    assert acceptance.ngram_next(12) is not following


def test_a_short_match_drafts_less_than_a_long_one_after_a_long_copy():
    # An answer that copied long matches (every later token kept) then meets a two-token
    # match: right after an edit, a chance hit elsewhere in the text. Its continuation is
    # not to be trusted as far as the copy's.
    drafter = AdaptiveDrafter(costs=CostModel(dict(QUIET), DRAFT_STEP), ngram=NgramDrafter())
    for _ in range(12):
        tokens = list(range(31))
        copy = Draft(tokens, [Distribution.point(t) for t in tokens], "ngram", match_length=16)
        drafter.acceptance.learn(copy, n_accepted=31)
    text = list(range(100, 156))
    long_match = propose(drafter, [*text, *text[:16]], max_tokens=40)
    chance_hit = [*range(300, 342), 7, 8, *range(200, 240), 7, 8]  # "7 8" alone matches
    short_match = propose(drafter, chance_hit, max_tokens=40)
    assert long_match.source == "ngram" and long_match.match_length >= 16
    assert short_match.tokens[:1] in ([], [200]) and short_match.match_length <= 2
    assert len(long_match.tokens) >= 31 and len(short_match.tokens) <= 3


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
    """A drafter model that is always sure (so each token is kept with probability 0.97),
    planned with no budget for what drafts that win nothing may lose (the plan alone)."""
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    model = ModelDrafter(FakeBackend(counting, N_VOCAB))
    costs = CostModel(verify_seconds, 0.01, learn=False)
    return AdaptiveDrafter(costs, model=model, probe_budget=float("inf"))


def test_a_model_draft_grows_while_verification_stays_cheap():
    draft = propose(confident_model_drafter({1: 1.0, 32: 1.0}), [1, 2, 3], max_tokens=6)
    assert draft.source == "model" and draft.tokens == [4, 5, 6, 7, 8, 9]


def softmax_top(row: np.ndarray) -> float:
    probs = np.exp(row.astype(np.float64) - row.max())
    return float(probs.max() / probs.sum())


@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0])
def test_a_drafters_confidence_is_its_softmax_top_probability(scale):
    # flat and peaked rows of Qwen2's vocabulary, logits far above exp's float32 range too
    rng = np.random.default_rng(int(scale * 10))
    for offset in (0.0, 120.0, -120.0):
        row = (rng.standard_normal(151_936) * scale + offset).astype(np.float32)
        expected = softmax_top(row)
        assert top_probability(row, int(np.argmax(row))) == pytest.approx(expected, rel=1e-5)


def test_a_model_drafts_confidences_are_its_softmax_top_probabilities():
    model = table_model(N_VOCAB, seed=4, context=2)
    draft = ModelDrafter(FakeBackend(model, N_VOCAB)).propose(
        [1, 2, 3], 4, GREEDY, GumbelChooser(0)
    )
    context = [1, 2, 3, *draft.tokens]
    wanted = [softmax_top(np.float32(model(tuple(context[: 3 + k])))) for k in range(4)]
    assert draft.confidences == pytest.approx(wanted, rel=1e-5)


def test_a_model_draft_compares_the_context_with_the_drafters_cache_once():
    # Each later step decodes the token the one before drafted, and nothing else: the whole
    # context is not compared again at each step (64 µs at 8k tokens).
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    backend = ComparisonsCounted(counting, N_VOCAB)
    drafter = ModelDrafter(backend)
    counted = [t % N_VOCAB for t in range(50)]  # what the scripted model drafts after each
    context = counted[:40]
    backend.decode(context[:20], 1)  # what an earlier round left
    draft = drafter.propose(context, 6, GREEDY, GumbelChooser(0))
    assert draft.tokens == counted[40:46]
    assert backend.comparisons == 1 and list(backend.cached) == counted[:45]
    backend.truncate(30)  # the cache is not what the draft left: compared, caught up
    draft = drafter.propose(counted[:42], 3, GREEDY, GumbelChooser(0))
    assert draft.tokens == counted[42:45] and backend.comparisons == 2


def test_a_drafters_cache_changed_between_steps_is_compared_again():
    by_position = scripted_model(lambda prefix: len(prefix) % N_VOCAB, N_VOCAB)
    backend = FakeBackend(by_position, N_VOCAB)
    drafter = ModelDrafter(backend)

    def cut_the_cache_at_the_third_step(k: int, sure: float) -> bool:
        if k == 2:
            backend.truncate(10)  # as if something else had used the drafter's model
        return True

    context = [1] * 20
    draft = drafter.grow(context, 5, GREEDY, GumbelChooser(0), cut_the_cache_at_the_third_step)
    assert draft.tokens == [n % N_VOCAB for n in range(20, 25)]


def test_a_model_draft_stops_where_its_next_token_costs_more_than_it_brings():
    # Verifying 5 tokens costs twice as much as 4: a 4th draft token would not pay.
    draft = propose(confident_model_drafter({1: 1.0, 4: 1.0, 8: 5.0}), [1, 2, 3], max_tokens=6)
    assert draft.tokens == [4, 5, 6]


def test_a_drafter_behind_by_a_whole_prompt_drafts_an_answer_with_room_left():
    # Catching the drafter up on a 300-token prompt costs about 300 x 0.4 of its steps,
    # once; shared by the rounds it serves, a draft pays (charged whole to one round, the
    # planner never drafted with a model). With two tokens left, it does not pay. (The plan
    # alone: whether the answer affords the catch-up is the next test's.)
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    prompt = [t % N_VOCAB for t in range(300)]

    def planner() -> AdaptiveDrafter:
        model = ModelDrafter(FakeBackend(counting, N_VOCAB))
        costs = CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0}, 0.1, learn=False)
        return AdaptiveDrafter(costs, model=model, probe_budget=float("inf"))

    assert propose(planner(), prompt, max_tokens=63).source == "model"
    assert propose(planner(), prompt, max_tokens=2).source == "none"


@pytest.mark.parametrize("price", [None, CatchUpPrice(0.05, 0.001)])
def test_a_planned_model_draft_waits_until_the_answer_affords_the_drafters_catch_up(price):
    # Model drafts pay by plan (verifying 8 rows costs what one does, a drafter step
    # 0.01 s), and a round is charged only its share of the catch-up. But the drafter has
    # read none of the 40 tokens, and its catch-up is paid at once, whole: 39 tokens at
    # this machine's price (unmeasured: 0.01 s x CATCH_UP_COST). A short answer (an agent's
    # turn after a tool's result) would never win it back, so the plan waits until the
    # answer could lose it within its budget.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 8: 1.0}, 0.01, price, learn=False),
        model=ModelDrafter(FakeBackend(counting, N_VOCAB)),
        model_probes=ProbeSchedule(first=10**6),
    )
    drafter.begin(40, [])
    context = [(7 * i) % N_VOCAB for i in range(40)]
    catch_up = 39 * 0.01 * CATCH_UP_COST if price is None else price.fixed + 39 * price.per_token
    plain_rounds(drafter, catch_up / PROBE_BUDGET - 0.5)
    assert propose(drafter, context, max_tokens=64).tokens == []
    plain_rounds(drafter, 0.501)
    draft = propose(drafter, context, max_tokens=64)
    assert draft.source == "model" and len(draft.tokens) > MODEL_PROBE_TOKENS  # planned


@pytest.mark.parametrize(("round_seconds", "still_drafts"), [(2.0, True), (20.0, False)])
def test_model_drafts_whose_rounds_take_longer_than_planned_stop(round_seconds, still_drafts):
    # Every draft is kept, but a round takes ten times what its plan priced (costs the
    # plan does not see): the realised rate, not the plan, decides.
    drafter = confident_model_drafter({1: 1.0, 2: 1.3, 4: 1.8, 8: 3.5})
    sources = []
    for _ in range(12):
        draft = propose(drafter, [1, 2, 3])
        sources.append(draft.source)
        kept = len(draft.tokens)
        drafter.observe(Outcome(draft, kept, round_seconds / 2, False, round_seconds / 2))
    assert sources[0] == "model"
    assert (sources[-1] == "model") == still_drafts


# --- healing: every decode is a measurement ------------------------------------------------------


def copying_run(clock: ScriptedClock, start: dict[int, float], mode: str = "ngram"):
    """An answer that copies its 100-token prompt four times over (an edit, as n-gram drafts
    see it), on a target whose decodes cost QUIET, planned from the `start` table.
    Returns the rounds, the finished answer and the drafter's cost model."""
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, N_VOCAB, 100)]
    answer = prompt * 4
    target, draft_backend = timed_pair(
        clock, QUIET, logits=sequence_model(answer, len(prompt), N_VOCAB), n_ctx=1024
    )
    costs = CostModel(dict(start), DRAFT_STEP)
    drafter = build_drafter(mode, target, draft_backend, costs=costs)
    settings = GenerationSettings(max_tokens=len(answer), draft_max=32)
    events = list(Generation(target, prompt, settings, drafter).events())
    rounds = [e for e in events if isinstance(e, Round)]
    return rounds, events[-1], costs


@pytest.mark.parametrize("mode", ["ngram", "combined"])
def test_a_poisoned_table_heals_within_one_answer(clock, mode):
    quiet_rounds, quiet, _ = copying_run(clock, QUIET, mode)
    rounds, poisoned, costs = copying_run(clock, POISONED, mode)
    assert poisoned.tokens == quiet.tokens
    # Drafting resumes within a bounded number of rounds.
    first_long = next(i for i, r in enumerate(rounds) if r.drafted >= 4)
    assert first_long <= 16
    assert poisoned.stats.tokens_per_second >= 0.9 * quiet.stats.tokens_per_second
    # What the next run would start from is the quiet table, to within 20%.
    healed = costs.healed().verify_seconds
    for n in QUIET:
        assert healed[n] == pytest.approx(QUIET[n], rel=0.2), n


def test_a_model_probe_is_short_however_sure_the_drafter_is():
    # A drafter step costs half a target step: model drafts do not pay at the acceptance
    # expected, so a model draft is only a probe now and then; a sure drafter would grow it
    # to the limit on confidence alone.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    model = ModelDrafter(FakeBackend(counting, N_VOCAB))
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 2: 1.1, 32: 1.5}, 0.5, learn=False),
        model=model,
        model_probes=ProbeSchedule(first=0),
        probe_budget=float("inf"),  # what a probe may cost: test_tries_that_do_not_pay_...
    )
    draft = propose(drafter, [1, 2, 3], max_tokens=8)
    assert draft.source == "model" and draft.tokens == [4, 5, 6, 7]


def test_short_ngram_guesses_that_win_on_price_do_not_stop_model_probes():
    # Two rows cost what one does (as on the Zen 5): a one-token n-gram guess after a chance
    # match of one token wins every round on price (1.2 tokens a pass at its prior), ahead
    # of model drafts priced by their priors (1.14). Model drafts must still be tried now
    # and then: they may pay more than their priors say.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 2: 1.0, 8: 3.0}, 0.2, learn=False),
        model=ModelDrafter(FakeBackend(counting, N_VOCAB)),
        ngram=NgramDrafter(),
        model_probes=ProbeSchedule(first=3),
        probe_budget=float("inf"),
    )
    context = [9, 1, 20, 30, 1]  # 1 occurred before, then 20: a one-token guess
    sources = []
    for _ in range(6):
        draft = propose(drafter, context)
        drafter.observe(Outcome(draft, 0, 1.0, False))
        sources.append((str(draft.source), len(draft.tokens)))
    assert sources[0] == ("ngram", 1)
    assert ("model", MODEL_PROBE_TOKENS) in sources  # a probe, once due


def test_exploring_with_no_free_source_verifies_a_filler_not_model_drafts():
    # Every draft is priced out, and the text repeats nothing: a try of a size the table
    # has not measured drafts the text's own last tokens (free to propose), not the model,
    # whose steps would cost half a target step each for drafts judged not to pay.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    model = ModelDrafter(FakeBackend(counting, N_VOCAB))
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 2: 3.0, 8: 24.0}, 0.5),
        model=model,
        ngram=NgramDrafter(),
        cost_probes=ProbeSchedule(first=0),
        probe_budget=float("inf"),
    )
    context = list(range(1, 12))
    draft = propose(drafter, context)
    assert draft.source == "explore" and draft.tokens
    assert draft.tokens == context[len(context) - len(draft.tokens) :]
    assert model.timings.steps == []  # the drafter model was not run


@pytest.mark.parametrize("alongside", [(0, 0), (3, 1)], ids=["alone", "beside three"])
def test_costs_are_explored_only_where_the_round_teaches_them(alongside):
    # Beside other requests a round's timing is not its own rows' cost (SharedPassCosts
    # learns nothing from it): a try of an unmeasured size would only widen the pass.
    drafter = AdaptiveDrafter(
        shared_pass_costs(CostModel({1: 1.0, 2: 3.0, 4: 4.0, 8: 24.0}, 0.5), lambda: alongside),
        ngram=NgramDrafter(),
        cost_probes=ProbeSchedule(first=0),
        probe_budget=float("inf"),
    )
    draft = propose(drafter, COPYING)  # priced out: drafted only to try a size
    assert bool(draft.tokens) == (alongside == (0, 0))


def plain_rounds(drafter: AdaptiveDrafter, seconds: float) -> None:
    """The answer so far: the prompt and rounds without drafts, `seconds` in all (timed with
    the prompt, so the cost table learns nothing from them)."""
    drafter.observe(Outcome(Draft.empty(), 0, seconds, True))


# The drafter has read none of the 40 tokens of text. A model probe costs its catch-up (39
# tokens: the 40th is its first step's; 39 x 0.1 s x CATCH_UP_COST = 1.56 s), 5 steps
# (0.5 s) and a verification of 5 (1.5 s beyond a plain step): 3.56 s. A filler
# exploration of the cheapest size, 2, costs 0.5 s beyond a plain step.
TRY_COSTS = {"model probe": 3.56, "filler": 0.5}


@pytest.mark.parametrize("kind", TRY_COSTS)
def test_tries_that_do_not_pay_cost_at_most_their_share_of_the_answer(kind):
    # Model drafts are priced out by their expected acceptance (though a drafter that is
    # always right would pay), the text repeats nothing, and a try of the kind is due
    # every round.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 2: 1.5, 5: 2.5, 8: 3.0}, 0.1, learn=kind == "filler"),
        model=ModelDrafter(FakeBackend(counting, N_VOCAB)),
        model_probes=ProbeSchedule(first=0 if kind == "model probe" else 10**6),
        cost_probes=ProbeSchedule(first=0 if kind == "filler" else 10**6),
    )
    drafter.begin(40, [])
    context = [(7 * i) % N_VOCAB for i in range(40)]
    plain_rounds(drafter, TRY_COSTS[kind] / PROBE_BUDGET - 1.0)
    assert propose(drafter, context, max_tokens=64).tokens == []  # over the budget: plain
    plain_rounds(drafter, 1.001)  # the answer has now taken a little over cost / budget
    draft = propose(drafter, context, max_tokens=64)
    assert draft.source == ("model" if kind == "model probe" else "explore") and draft.tokens
    drafter.observe(Outcome(draft, 0, 1.0 + TRY_COSTS[kind], False))  # it won nothing
    assert propose(drafter, context, max_tokens=64).tokens == []  # spent: plain again


def test_what_drafting_saved_pays_for_a_probe_early():
    # As above, a model probe costs 3.56 s beyond a plain step, and the answer has taken
    # only 2 s: but one round before, the target kept 8 drafted tokens for the price of
    # one, and saved 8 s. Predictable text is where a probe may find model drafts that pay.
    counting = scripted_model(lambda prefix: (prefix[-1] + 1) % N_VOCAB, N_VOCAB)
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 2: 1.5, 5: 2.5, 8: 3.0}, 0.1, learn=False),
        model=ModelDrafter(FakeBackend(counting, N_VOCAB)),
        model_probes=ProbeSchedule(first=0),
    )
    drafter.begin(40, [])
    context = [(7 * i) % N_VOCAB for i in range(40)]
    plain_rounds(drafter, 1.0)
    drafter.observe(Outcome(ngram_draft(context[-8:], 8), 8, 1.0, False))
    assert propose(drafter, context, max_tokens=64).source == "model"


def test_a_due_exploration_never_cuts_a_planned_draft_short():
    # The copy's match plans a full draft at a cheap table; the exploration that is due
    # would have tried a size the run has not measured (2: one token). Instead it waits.
    drafter = AdaptiveDrafter(
        CostModel({1: 1.0, 64: 1.0}, 0.0), ngram=NgramDrafter(), cost_probes=ProbeSchedule(first=0)
    )
    draft = propose(drafter, COPYING, max_tokens=8)
    assert draft.source == "ngram" and len(draft.tokens) == 8
    assert drafter.cost_probes.due()  # still due: tried when the plan drafts less


def test_a_size_the_table_overprices_is_tried_now_and_then(clock):
    # Only 8 tokens and more are overpriced: drafting never stops, but without trying the
    # dear sizes the planner would never learn that long drafts pay.
    start = {n: s if n < 8 else 3 * s for n, s in QUIET.items()}
    rounds, _, costs = copying_run(clock, start, "ngram")
    assert costs.observations(8) + costs.observations(16) + costs.observations(32) > 0
    assert max(r.drafted for r in rounds) >= 15


# --- a pass shared with other requests (serve --parallel) ------------------------------------

# The Zen 5's exact table, in milliseconds: 4 rows cost 1.3x one, 8 rows 2.2x.
ZEN5 = {1: 31.9, 2: 30.0, 4: 41.7, 8: 70.1, 16: 151.0, 32: 285.0, 64: 521.0}


def shared_ngram_drafter(alongside: list[tuple[int, int]]) -> AdaptiveDrafter:
    costs = shared_pass_costs(CostModel(ZEN5, 0.0), lambda: alongside[0])
    return AdaptiveDrafter(costs, ngram=NgramDrafter())


def test_rows_in_a_shared_pass_cost_what_they_add_to_it_padded_or_ragged():
    alone = CostModel(ZEN5, 0.0)
    costs = shared_pass_costs(CostModel(ZEN5, 0.0), lambda: (3, 1))  # three one-row requests
    first = alone.verify(4) - alone.verify(3)
    assert costs.verify(1) == pytest.approx(first)
    # Two rows pad the three others to two: 8 rows instead of 4 (cheaper than a second
    # compute for the one further row).
    assert costs.verify(2) == pytest.approx(first + alone.verify(8) - alone.verify(4))
    # Five rows padded would be 20; ragged, the pass of 4 and a compute of its 4 more.
    assert alone.verify(4) < alone.verify(20) - alone.verify(4)
    assert costs.verify(5) == pytest.approx(first + alone.verify(4))
    # Priced as if the others decoded one row each, however wide they were: rows up to
    # their width would look free, and every pass would stay that wide.
    wide = shared_pass_costs(CostModel(ZEN5, 0.0), lambda: (3, 6))
    assert wide.verify(5) == pytest.approx(costs.verify(5))
    floor = shared_pass_costs(CostModel({1: 1.0, 2: 0.9, 4: 1.3}, 0.0), lambda: (1, 1))
    assert floor.verify(1) == pytest.approx(MIN_ROW_SHARE)  # 2 rows priced below 1


@pytest.mark.parametrize("alongside", [(0, 0), (1, 1), (3, 2)])
def test_the_costs_of_every_draft_length_at_once_are_each_lengths_cost(alongside):
    costs = shared_pass_costs(CostModel({1: 1.0, 2: 0.9, 4: 1.3, 16: 4.0}, 0.0), lambda: alongside)
    costs.observe_verify(2, 1.2)  # a learned size rescales the prior around it
    assert costs.verify_sizes(12) == pytest.approx([costs.verify(n) for n in range(1, 13)])


def test_shared_costs_learn_only_from_rounds_a_request_has_to_itself():
    alongside = [(3, 1)]
    costs = shared_pass_costs(CostModel({1: 1.0, 8: 3.0}, 0.1), lambda: alongside[0])
    costs.observe_verify(1, 5.0)  # the whole pass, and the others' drafting: not its cost
    costs.observe_draft_step(0.5)
    assert costs.observations(1) == 0 and costs.draft_step == 0.1
    alongside[0] = (0, 0)
    costs.observe_verify(1, 2.0)
    costs.observe_draft_step(0.2)
    assert costs.verify(1) == pytest.approx(2.0) and costs.draft_step == pytest.approx(0.2)


def test_drafts_shrink_as_the_pass_fills_with_other_requests_rows():
    alone = propose(shared_ngram_drafter([(0, 0)]), COPYING, max_tokens=8)
    crowded = propose(shared_ngram_drafter([(3, 1)]), COPYING, max_tokens=8)
    assert alone.source == "ngram" and len(alone.tokens) >= 3
    assert len(crowded.tokens) < len(alone.tokens)


# --- text a constraint forces (a draft source of its own) -------------------------------------

FORCED = [21, 22, 23, 24, 25, 26]


def forced_planner(verify_seconds: dict[int, float]) -> AdaptiveDrafter:
    return AdaptiveDrafter(CostModel(verify_seconds, 0.0, learn=False))


def test_forced_text_is_drafted_as_far_as_it_pays():
    cheap = forced_planner({1: 1.0, 8: 1.2}).plan_forced(FORCED)
    assert cheap.source == "forced" and cheap.tokens == FORCED
    # A row past the first costs as much as the first: five kept tokens of six would not
    # pay a draft of six (0.95 each), a few of them still do.
    dear = forced_planner({1: 1.0, 2: 1.6, 8: 8.0}).plan_forced(FORCED)
    assert 0 < len(dear.tokens) < len(FORCED)
    assert forced_planner({1: 1.0, 2: 4.0}).plan_forced(FORCED).tokens == []


def test_forced_drafts_learn_their_own_acceptance():
    planner = forced_planner({1: 1.0, 2: 1.3, 8: 3.0})
    assert planner.plan_forced(FORCED).tokens == FORCED
    for _ in range(20):  # this target writes the forced text otherwise: none of it kept
        planner.observe(Outcome(ngram_draft(FORCED, 0, DraftSource.FORCED), 0, 1.0, False))
    assert planner.acceptance.forced_first.value < 0.2
    assert planner.plan_forced(FORCED).tokens == []
    # The other sources' rates are untouched.
    assert planner.acceptance.for_ngram(4).value == pytest.approx(NGRAM_FIRST_PRIORS[3])


def test_a_forced_draft_and_its_continuation_cut_and_learn_each_as_its_own():
    forced = ngram_draft([21, 22, 23], 0, DraftSource.FORCED)
    after = ngram_draft([31, 32], 5, DraftSource.NGRAM)
    both = forced.then(after)
    assert both.tokens == [21, 22, 23, 31, 32] and both.source == "forced"
    assert both.cut(2).tokens == [21, 22] and both.cut(2).after is None
    assert both.cut(4).tokens == [21, 22, 23, 31] and both.cut(4).after.tokens == [31]
    learned = AcceptanceModel()
    learned.learn(both, 4)  # all the forced text kept, then the first continuation token
    assert learned.forced_first.value > FORCED_FIRST_PRIOR
    assert learned.for_ngram(5).total > learned.for_ngram(5).weight  # the n-gram's own
    untouched = AcceptanceModel()
    untouched.learn(both, 1)  # rejected inside the forced text: the continuation unseen
    assert untouched.for_ngram(5).total == untouched.for_ngram(5).weight
