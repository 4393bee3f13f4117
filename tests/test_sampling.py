"""Logits processing, residuals and the acceptance rules, checked against direct formulas."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specdec_cli.decoding.backend import ArgmaxRows
from specdec_cli.decoding.sampling import (
    Distribution,
    SamplingSettings,
    distribution,
    residual,
    top2_margin,
)
from specdec_cli.decoding.verification import Verdict, greedy_accept, speculative_accept

LOGITS = np.array([1.0, 3.0, -2.0, 0.5, 2.0, 2.5, -1.0, 0.0])  # sorted ids: 1 5 4 0 3 7 6 2


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def plain(temperature: float = 1.0, **cuts) -> SamplingSettings:
    """Settings with every cut off unless given."""
    base = dict(top_k=0, top_p=1.0, min_p=0.0)
    base.update(cuts)
    return SamplingSettings(temperature=temperature, **base)


def dense(dist: Distribution, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[dist.ids] = dist.probs
    return out


def dist_of(probs: dict[int, float]) -> Distribution:
    ids = sorted(probs, key=lambda t: -probs[t])
    return Distribution(np.array(ids, dtype=np.int64), np.array([probs[t] for t in ids]))


# --- distribution() ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.8])
def test_temperature_alone_is_softmax_of_scaled_logits(temperature):
    d = distribution(LOGITS, plain(temperature))
    assert d.probs.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(dense(d, 8), softmax(LOGITS / temperature), rtol=1e-12)
    assert np.all(np.diff(d.probs) <= 0), "ids come sorted by descending probability"


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_top_k_keeps_the_k_largest(k):
    d = distribution(LOGITS, plain(top_k=k))
    assert set(d.ids.tolist()) == set(np.argsort(-LOGITS)[:k].tolist())
    np.testing.assert_allclose(d.probs, softmax(np.sort(LOGITS)[::-1][:k]))


@pytest.mark.parametrize("k", [0, -1, 8, 100])
def test_top_k_off_or_too_large_keeps_everything(k):
    assert len(distribution(LOGITS, plain(top_k=k)).ids) == 8


@pytest.mark.parametrize("p", [0.1, 0.4, 0.5, 0.75, 0.9, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p):
    d = distribution(LOGITS, plain(top_p=p))
    sorted_probs = np.sort(softmax(LOGITS))[::-1]
    cumulative = np.cumsum(sorted_probs)
    n = len(d.ids)
    assert cumulative[n - 1] >= p
    assert n == 1 or cumulative[n - 2] < p
    np.testing.assert_allclose(d.probs, sorted_probs[:n] / sorted_probs[:n].sum())
    assert d.probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5, 0.9])
def test_min_p_drops_tokens_below_a_fraction_of_the_best(min_p):
    d = distribution(LOGITS, plain(min_p=min_p))
    probs = softmax(LOGITS)
    assert set(d.ids.tolist()) == set(np.flatnonzero(probs >= min_p * probs.max()).tolist())
    assert d.probs.sum() == pytest.approx(1.0)


def test_cuts_apply_before_temperature_as_in_llama_cpp():
    # llama.cpp's chain is top-k, top-p, min-p, then temperature: the cuts see the
    # temperature-1 softmax, and temperature only reshapes what survives.
    temperature = 0.5
    d = distribution(LOGITS, plain(temperature, top_k=6, top_p=0.8, min_p=0.0))
    top6 = np.sort(LOGITS)[::-1][:6]
    n = int(np.searchsorted(np.cumsum(softmax(top6)), 0.8)) + 1
    np.testing.assert_allclose(d.probs, softmax(top6[:n] / temperature))
    d = distribution(LOGITS, plain(3.0, min_p=0.3))
    probs = softmax(LOGITS)
    assert set(d.ids.tolist()) == set(np.flatnonzero(probs >= 0.3 * probs.max()).tolist())


def test_top_p_is_measured_after_top_k():
    # After top-2 the renormalised best token alone has more than 0.6 of the mass.
    d = distribution(LOGITS, plain(top_k=2, top_p=0.6))
    assert d.ids.tolist() == [1]


def test_greedy_is_a_point_mass_at_the_argmax():
    d = distribution(LOGITS, SamplingSettings(temperature=0.0))
    assert d.ids.tolist() == [1] and d.probs.tolist() == [1.0]
    assert distribution(LOGITS, SamplingSettings(temperature=-1.0)).ids.tolist() == [1]


def test_defaults_give_a_valid_distribution_on_a_big_vocabulary():
    logits = np.random.default_rng(0).normal(0, 3, 5000).astype(np.float32)
    d = distribution(logits, SamplingSettings(temperature=0.8))
    assert 1 <= len(d.ids) <= 40
    assert d.probs.sum() == pytest.approx(1.0)
    assert d.ids[0] == int(np.argmax(logits))


def sorted_reference(logits: np.ndarray, settings: SamplingSettings) -> tuple[list, np.ndarray]:
    """distribution() as written plainly: sort the whole row, cut, scale."""
    order = np.argsort(-logits, kind="stable")
    if 0 < settings.top_k < len(logits):
        order = order[: settings.top_k]
    chosen = logits[order].astype(np.float64)
    probs = np.exp(chosen - chosen[0])
    probs /= probs.sum()
    keep = len(probs)
    if settings.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), settings.top_p)) + 1)
    if settings.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= settings.min_p * probs[0])))
    kept = np.exp((chosen[:keep] - chosen[0]) / settings.temperature)
    return order[:keep].tolist(), kept / kept.sum()


@pytest.mark.parametrize("scale", [0.5, 2.0, 6.0])  # flat to peaked rows of Qwen's size
@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"),
    [
        (40, 0.95, 0.05),
        (0, 0.95, 0.05),
        (0, 0.9, 0.0),
        (0, 1.0, 0.1),
        (0, 1.0, 0.0),
        (1000, 0.5, 0.0),
    ],
)
def test_a_big_rows_distribution_is_the_whole_sorted_rows(scale, top_k, top_p, min_p):
    """Only the likeliest tokens are sorted (sampling.likeliest, min-p's floor, top-p's
    mass): the same tokens and probabilities as sorting the whole row."""
    logits = np.random.default_rng(int(scale * 10)).normal(0.0, scale, 151936).astype(np.float32)
    settings = SamplingSettings(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    ids, probs = sorted_reference(logits, settings)
    dist = distribution(logits, settings)
    assert dist.ids.tolist() == ids
    np.testing.assert_allclose(dist.probs, probs, rtol=1e-5)


def test_distribution_lookup_and_sampling():
    d = dist_of({3: 0.5, 0: 0.3, 7: 0.2})
    assert d.prob(0) == 0.3 and d.prob(5) == 0.0
    np.testing.assert_allclose(d.probs_at(np.array([7, 1, 3, 9])), [0.2, 0.0, 0.5, 0.0])
    rng = np.random.default_rng(1)
    draws = np.array([d.sample(rng) for _ in range(20_000)])
    counts = [np.count_nonzero(draws == t) for t in (3, 0, 7)]
    assert counts[0] + counts[1] + counts[2] == 20_000
    assert stats.chisquare(counts, np.array([0.5, 0.3, 0.2]) * 20_000).pvalue > 1e-3


def test_point_and_zero_probability_entries_are_never_sampled():
    rng = np.random.default_rng(2)
    assert {Distribution.point(4).sample(rng) for _ in range(50)} == {4}
    d = Distribution(np.array([1, 2, 3]), np.array([0.0, 1.0, 0.0]))
    assert {d.sample(rng) for _ in range(200)} == {2}


def test_top2_margin():
    assert top2_margin(LOGITS) == pytest.approx(0.5)


# --- residual ---------------------------------------------------------------------------------


def test_residual_is_normalised_positive_part_of_p_minus_q():
    p = dist_of({0: 0.5, 1: 0.3, 2: 0.2})
    q = dist_of({0: 0.2, 1: 0.5, 3: 0.3})
    r = residual(p, q)
    # max(0, p - q) = {0: 0.3, 2: 0.2}
    assert r.ids.tolist() == [0, 2]
    np.testing.assert_allclose(r.probs, [0.6, 0.4])


def test_residual_with_disjoint_support_is_the_target():
    p = dist_of({0: 0.7, 1: 0.3})
    r = residual(p, dist_of({2: 1.0}))
    np.testing.assert_allclose(dense(r, 3), [0.7, 0.3, 0.0])


def test_residual_of_equal_distributions_falls_back_to_the_target():
    p = dist_of({0: 0.7, 1: 0.3})
    r = residual(p, dist_of({0: 0.7, 1: 0.3}))
    np.testing.assert_allclose(dense(r, 2), [0.7, 0.3])


# --- greedy_accept ------------------------------------------------------------------------------


def rows_with_argmax(argmaxes: list[int], n_vocab: int = 5) -> np.ndarray:
    rows = np.zeros((len(argmaxes), n_vocab), dtype=np.float32)
    rows[np.arange(len(argmaxes)), argmaxes] = 1.0
    return rows


def choices(argmaxes: list[int]) -> ArgmaxRows:
    """The choices the host takes from rows whose argmaxes are these."""
    return ArgmaxRows(rows_with_argmax(argmaxes))


def test_greedy_accept_all_then_bonus():
    assert greedy_accept([1, 2, 3], choices([1, 2, 3, 4])) == Verdict(3, 4)


@pytest.mark.parametrize("at", [0, 1, 2])
def test_greedy_accept_stops_at_first_mismatch(at):
    target = [1, 2, 3, 4]
    draft = [1, 2, 3]
    draft[at] = 0
    assert greedy_accept(draft, choices(target)) == Verdict(at, target[at])


def test_greedy_accept_empty_draft_is_the_argmax():
    assert greedy_accept([], choices([2])) == Verdict(0, 2)


class RowsRead:
    """Logit rows that note which of them are read."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows, self.read = rows, set()

    def __getitem__(self, i):
        self.read.add(i)
        return self.rows[i]

    def __array__(self, dtype=None, copy=None):  # read whole
        self.read.update(range(len(self.rows)))
        return self.rows


def test_greedy_accept_reads_no_row_after_the_first_mismatch():
    # a row is the whole vocabulary: a rejected draft's later rows are never needed
    rows = RowsRead(rows_with_argmax([1, 2, 3, 4, 5, 6, 7, 8, 9], n_vocab=10))
    assert greedy_accept([1, 2, 0, 4, 5, 6, 7, 8], ArgmaxRows(rows)) == Verdict(2, 3)
    assert rows.read == {0, 1, 2}


# --- speculative_accept ---------------------------------------------------------------------------


def test_equal_distributions_accept_everything():
    p = dist_of({0: 0.6, 1: 0.4})
    for seed in range(200):
        v = speculative_accept([0, 1], [p, p], [p, p, p], np.random.default_rng(seed))
        assert v.n_accepted == 2 and v.next_token in (0, 1)


def test_zero_target_probability_is_always_rejected_and_never_the_replacement():
    p = dist_of({0: 0.6, 1: 0.4})
    q = dist_of({2: 0.9, 0: 0.1})
    for seed in range(200):
        v = speculative_accept([2], [q], [p, p], np.random.default_rng(seed))
        assert v.n_accepted == 0 and v.next_token in (0, 1)


def test_empty_draft_samples_the_target():
    p = dist_of({3: 1.0})
    assert speculative_accept([], [], [p], np.random.default_rng(0)) == Verdict(0, 3)


def test_draft_token_its_drafter_could_not_produce_is_a_bug():
    p = dist_of({0: 1.0})
    with pytest.raises(ValueError, match="zero probability"):
        speculative_accept([1], [dist_of({0: 1.0})], [p, p], np.random.default_rng(0))


def test_a_rejected_token_is_never_the_replacement():
    # Rejection only happens where p(x) < q(x), and the residual is zero there.
    p = dist_of({0: 0.3, 1: 0.3, 2: 0.4})
    q = dist_of({0: 0.8, 1: 0.1, 2: 0.1})
    for seed in range(500):
        v = speculative_accept([0], [q], [p, p], np.random.default_rng(seed))
        if v.n_accepted == 0:
            assert v.next_token != 0


def test_one_position_output_is_distributed_as_the_target():
    # Draft x ~ q; the emitted first token must be ~ p, and x kept w.p. min(1, p/q).
    p = dist_of({0: 0.5, 1: 0.3, 2: 0.15, 3: 0.05})
    q = dist_of({0: 0.1, 1: 0.6, 2: 0.05, 4: 0.25})
    bonus = dist_of({4: 1.0})
    rng = np.random.default_rng(3)
    n = 40_000
    firsts = np.zeros(5, dtype=np.int64)
    kept = 0
    for _ in range(n):
        x = q.sample(rng)
        v = speculative_accept([x], [q], [p, bonus], rng)
        firsts[x if v.n_accepted else v.next_token] += 1
        kept += v.n_accepted
    expected = dense(p, 5) * n
    assert firsts[4] == 0
    assert stats.chisquare(firsts[:4], expected[:4]).pvalue > 1e-3
    accept_rate = sum(min(q.prob(t), p.prob(t)) for t in range(5))  # sum_x min(p, q)
    assert stats.binomtest(kept, n, accept_rate).pvalue > 1e-3
