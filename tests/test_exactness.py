"""Speculative sampling must produce exactly the target's distribution over whole answers.

On a 4-token vocabulary (3 words and EOS) and answers of at most 4 tokens, the target's
probability of every possible answer is computed exactly, by multiplying its processed
next-token distributions along the answer. Then 20,000 answers are drawn through
`Generation` with a model drafter, and a chi-square goodness-of-fit test compares the
counts with the exact probabilities. The same harness must reject rules known to be wrong,
so a pass means something.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from fakes import FakeBackend, blended, negated, table_model
from scipy import stats

from specdec_cli.decoding import sampling as sampling_module
from specdec_cli.decoding.adaptive import AdaptiveDrafter, ProbeSchedule
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.drafters import ModelDrafter, NgramDrafter
from specdec_cli.decoding.engine import Finished, Generation, GenerationSettings
from specdec_cli.decoding.sampling import Distribution, SamplingSettings, distribution
from specdec_cli.decoding.text_drafter import TextDrafter
from specdec_cli.decoding.verification import (
    AcceptanceRule,
    SamplingRule,
    Verdict,
    speculative_accept,
)

N_VOCAB = 4
EOS = 3
LENGTH = 4  # max_tokens
PROMPT = [0, 1]
SAMPLES = 20_000
REJECT_P = 1e-6

TARGET = table_model(N_VOCAB, seed=1, context=None, scale=1.5)  # depends on the whole prefix
DRAFTERS = {
    "similar": blended(TARGET, table_model(N_VOCAB, seed=2, context=None, scale=1.5), 0.4),
    "unlike": negated(TARGET),
    "same": TARGET,
}


def settings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> SamplingSettings:
    return SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def exact_distribution(target: FakeBackend, sampling: SamplingSettings) -> dict[tuple, float]:
    """P(answer) for every answer; an answer ending in EOS keeps the EOS as its last item."""
    out: dict[tuple, float] = {}

    def walk(answer: tuple[int, ...], prob: float) -> None:
        if len(answer) == LENGTH:
            out[answer] = prob
            return
        dist = distribution(target.logits(tuple(PROMPT) + answer), sampling)
        for token, p in zip(dist.ids.tolist(), dist.probs.tolist(), strict=True):
            if token == EOS:
                out[answer + (EOS,)] = prob * p
            else:
                walk(answer + (token,), prob * p)

    walk((), 1.0)
    return out


def draw(
    sampling: SamplingSettings,
    drafter_model: str,
    acceptance: AcceptanceRule = speculative_accept,
    min_confidence: float = 0.0,
    samples: int = SAMPLES,
    adaptive: str | None = None,
    rule: SamplingRule = SamplingRule.CLASSIC,
) -> tuple[FakeBackend, Counter]:
    target = FakeBackend(TARGET, N_VOCAB, end_of_generation={EOS})
    drafter: ModelDrafter | TextDrafter
    if drafter_model == "by text":
        drafter = TextDrafter(other_vocabulary_drafter(), target)
    else:
        drafter = ModelDrafter(target.twin(DRAFTERS[drafter_model]), min_confidence=min_confidence)
    if adaptive:  # point-mass n-gram drafts, model drafts and plain rounds, chosen as it learns
        costs = CostModel({1: 1.0, 2: 1.3, 8: 3.1}, 0.2, learn=False)
        model = drafter if adaptive == "combined" else None
        often = {
            "model_probes": ProbeSchedule(2, 2),
            "ngram_probes": ProbeSchedule(2, 2),
            "probe_budget": float("inf"),  # every kind of draft, however dear
        }
        drafter = AdaptiveDrafter(costs, model=model, ngram=NgramDrafter(), **often)
    counts: Counter = Counter()
    for seed in range(samples):
        gen_settings = GenerationSettings(
            max_tokens=LENGTH, draft_max=3, sampling=sampling, seed=seed, rule=rule
        )
        *_, done = Generation(target, PROMPT, gen_settings, drafter, acceptance).events()
        assert isinstance(done, Finished)
        eos = (EOS,) if done.finish_reason == "stop" else ()
        counts[tuple(done.tokens) + eos] += 1
    return target, counts


# A drafter of another vocabulary (the target's words are "a", "b", "c"): single letters,
# tokens that spell two or three of the target's, and its own end of turn. Its logits depend
# on its whole prefix, so its text drafts change with everything drawn so far.
OTHER_PIECES = {0: b"a", 1: b"b", 2: b"c", 3: b"ab", 4: b"ca", 5: b"bcb", 6: b""}


def other_vocabulary_drafter() -> FakeBackend:
    logits = table_model(len(OTHER_PIECES), seed=5, context=None, scale=1.5)
    return FakeBackend(logits, len(OTHER_PIECES), end_of_generation={6}, pieces=OTHER_PIECES)


def chi_square_p(counts: Counter, expected: dict[tuple, float]) -> float:
    """Chi-square p-value, bins expecting < 5 pooled; 0.0 if an impossible answer came up."""
    n = sum(counts.values())
    if any(answer not in expected or expected[answer] == 0.0 for answer in counts):
        return 0.0
    answers = sorted(expected, key=lambda a: expected[a])
    exp = np.array([expected[a] * n for a in answers])
    obs = np.array([counts.get(a, 0) for a in answers], dtype=float)
    # Pool every bin expecting < 5, then more of the smallest until the pool expects >= 5.
    cut = int(np.count_nonzero(exp < 5.0))
    while 0 < cut < len(exp) and exp[:cut].sum() < 5.0:
        cut += 1
    if cut:
        exp = np.concatenate([[exp[:cut].sum()], exp[cut:]])
        obs = np.concatenate([[obs[:cut].sum()], obs[cut:]])
    assert np.all(exp >= 5.0) and len(exp) > 1
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def fit(sampling: SamplingSettings, drafter_model: str, **kwargs) -> tuple[float, Counter]:
    target, counts = draw(sampling, drafter_model, **kwargs)
    return chi_square_p(counts, exact_distribution(target, sampling)), counts


CASES = {
    "t1.0": (settings(1.0), "similar"),
    "t0.7-topk3": (settings(0.7, top_k=3), "similar"),
    "t1.3-topp0.8": (settings(1.3, top_p=0.8), "similar"),
    "minp0.2": (settings(1.0, min_p=0.2), "similar"),
    "t1.0-unlike": (settings(1.0), "unlike"),
    "t0.8-all-cuts-unlike": (settings(0.8, top_k=3, top_p=0.9, min_p=0.1), "unlike"),
}


RULES = [SamplingRule.CLASSIC, SamplingRule.INVARIANT]
ADAPTIVE_CASES = [
    ("combined", settings(1.0)),
    ("combined", settings(0.8, top_k=3, top_p=0.9)),
    ("ngram", settings(1.0)),
    ("ngram", settings(0.7, min_p=0.1)),
]
BY_TEXT_CASES = {
    "classic-fixed": (SamplingRule.CLASSIC, None, settings(1.0)),
    "classic-combined-cuts": (SamplingRule.CLASSIC, "combined", settings(0.8, top_k=3, top_p=0.9)),
    "invariant-fixed-cuts": (SamplingRule.INVARIANT, None, settings(0.8, top_k=3, top_p=0.9)),
}
# Every fit below that must pass (the confidence cut-off's is the last one). Each draws
# with fixed seeds, but a harmless change that consumes random numbers in another order
# draws afresh: with each fit passing at p > FAMILY_P / FITS (Bonferroni), such a change
# fails some correct fit with probability at most FAMILY_P. A wrong rule gives p < REJECT_P
# (the harness-rejects tests), far below the threshold.
FITS = len(CASES) * len(RULES) + len(ADAPTIVE_CASES) * len(RULES) + len(BY_TEXT_CASES) + 1
FAMILY_P = 1e-3
PASS_P = FAMILY_P / FITS


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.value)
@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_the_target_exactly(case, rule):
    sampling, drafter_model = CASES[case]
    p, counts = fit(sampling, drafter_model, rule=rule)
    assert p > PASS_P, f"{case}: chi-square p={p:.3g}; counts {counts.most_common(8)}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.value)
@pytest.mark.parametrize(("mode", "sampling"), ADAPTIVE_CASES)
def test_adaptive_drafting_keeps_sampling_exact(mode, sampling, rule):
    p, _ = fit(sampling, "similar", adaptive=mode, rule=rule)
    assert p > PASS_P, f"chi-square p={p:.3g}"


@pytest.mark.parametrize(
    ("rule", "adaptive", "sampling"), list(BY_TEXT_CASES.values()), ids=list(BY_TEXT_CASES)
)
def test_drafts_by_text_from_another_vocabulary_keep_sampling_exact(rule, adaptive, sampling):
    p, counts = fit(sampling, "by text", adaptive=adaptive, rule=rule)
    assert p > PASS_P, f"chi-square p={p:.3g}; counts {counts.most_common(8)}"


def test_drafter_confidence_cutoff_keeps_sampling_exact():
    # Stopping a draft early must not depend on the token the drafter just drew.
    p, _ = fit(settings(1.0), "similar", min_confidence=0.45)
    assert p > PASS_P, f"chi-square p={p:.3g}"


# --- the harness has the power to catch wrong rules -------------------------------------------


def accept_everything(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution],
    target_dists: Sequence[Distribution],
    rng: np.random.Generator,
) -> Verdict:
    return Verdict(len(draft), target_dists[len(draft)].sample(rng))


def resample_from_target_on_rejection(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution],
    target_dists: Sequence[Distribution],
    rng: np.random.Generator,
) -> Verdict:
    """The classic slip: the right acceptance test, but the replacement drawn from p, not
    from the residual."""
    for i, token in enumerate(draft):
        p, q = target_dists[i].prob(token), draft_dists[i].prob(token)
        if rng.random() * q >= p:
            return Verdict(i, target_dists[i].sample(rng))
    return Verdict(len(draft), target_dists[len(draft)].sample(rng))


@pytest.mark.parametrize(
    "rule", [accept_everything, resample_from_target_on_rejection], ids=lambda r: r.__name__
)
def test_the_harness_rejects_a_wrong_rule(rule):
    p, _ = fit(settings(1.0), "unlike", acceptance=rule)
    assert p < REJECT_P, f"{rule.__name__} passed the fit (p={p:.3g}): the test has no power"


def test_the_harness_rejects_wrong_noise_in_the_invariant_rule(monkeypatch):
    # Exponential noise in place of Gumbel: argmax(log p + noise) no longer samples from p.
    gumbel = sampling_module.gumbel_noise

    def exponential_noise(seed, position, ids):
        return -np.log(np.exp(-np.exp(-gumbel(seed, position, ids))))  # -log(U), U uniform

    monkeypatch.setattr(sampling_module, "gumbel_noise", exponential_noise)
    p, _ = fit(settings(1.0), "unlike", rule=SamplingRule.INVARIANT)
    assert p < REJECT_P, f"exponential noise passed the fit (p={p:.3g}): the test has no power"


def test_exact_distribution_sums_to_one_and_covers_every_answer():
    target = FakeBackend(TARGET, N_VOCAB, end_of_generation={EOS})
    for sampling, _ in CASES.values():
        expected = exact_distribution(target, sampling)
        assert sum(expected.values()) == pytest.approx(1.0)
    expected = exact_distribution(target, settings(1.0))
    words = range(N_VOCAB - 1)
    every = {a for n in range(LENGTH) for a in itertools.product(words, repeat=n)}
    assert set(expected) == {a + (EOS,) for a in every} | set(
        itertools.product(words, repeat=LENGTH)
    )


def test_a_drafter_equal_to_the_target_only_produces_possible_answers():
    # With q == p every draft is kept; the cuts must still rule out what the target rules out.
    sampling = settings(0.9, top_k=2)
    target, counts = draw(sampling, "same", samples=2_000)
    expected = exact_distribution(target, sampling)
    assert all(expected.get(answer, 0.0) > 0.0 for answer in counts)
    assert len(counts) < len(exact_distribution(target, settings(1.0)))


def test_the_harness_rejects_a_wrong_rule_for_drafts_by_text():
    p, _ = fit(settings(1.0), "by text", acceptance=accept_everything)
    assert p < REJECT_P, f"accepting every text draft passed the fit (p={p:.3g})"
