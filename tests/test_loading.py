"""Sizing the context when --ctx-size is not given; the decode-costs cache."""

from __future__ import annotations

import time
from dataclasses import astuple
from pathlib import Path

import pytest
from fakes import (
    FakeBackend,
    ScriptedClock,
    TimedBackend,
    decode_request,
    gpu_like_drafter,
    scripted_model,
    table_cost,
    table_model,
)

from specdec_cli.decoding.costs import CatchUpPrice
from specdec_cli.json_cache import read_json_cache, write_json_cache
from specdec_cli.models.loading import MIN_CONTEXT, ModelPair, context_size, fit_context
from specdec_cli.request import HardwareOptions
from specdec_cli.services.cost_cache import costs_cache, costs_key, pair_costs, remember_costs


@pytest.mark.parametrize(
    ("needed", "trained", "size"),
    [
        (100, 32768, MIN_CONTEXT),  # a short answer still gets the floor
        (1500, 32768, 1536),  # rounded up to llama.cpp's steps of 256
        (9000, 4096, 4096),  # never past what the model was trained for
        (100, 512, 512),  # not even for the floor
        (1500, 0, 1536),  # a model that does not say
    ],
)
def test_context_size(needed, trained, size):
    assert context_size(needed, trained) == size


def fake_pair(trained: int) -> ModelPair:
    target = FakeBackend(table_model(10, seed=1), n_vocab=10, n_ctx=MIN_CONTEXT)
    target.n_ctx_train = trained
    return ModelPair(target, target.twin())


def test_both_models_get_the_context_the_text_needs():
    pair = fake_pair(trained=32768)
    pair.target.decode([1, 2, 3], 1)
    fit_context(pair, HardwareOptions(), needed=3000)
    assert pair.target.n_ctx == pair.drafter.n_ctx == 3072
    assert pair.target.cached == []


def test_the_users_ctx_size_is_kept():
    pair = fake_pair(trained=32768)
    fit_context(pair, HardwareOptions(ctx_size=MIN_CONTEXT), needed=3000)
    assert pair.target.n_ctx == pair.drafter.n_ctx == MIN_CONTEXT


# --- the decode-costs cache ----------------------------------------------------------------------

QUIET = {1: 0.046, 2: 0.060, 4: 0.101, 8: 0.189, 16: 0.300, 32: 0.560}
BUSY = {n: s if n == 1 else 3 * s for n, s in QUIET.items()}  # probed during a build
BYTES = [bytes([b]) for b in range(256)]  # tokenizes any text, the probe's included


@pytest.fixture
def clock(monkeypatch) -> ScriptedClock:
    clock = ScriptedClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def timed_pair(clock: ScriptedClock, costs: dict[int, float], folder: Path) -> ModelPair:
    """A pair of TimedBackends standing for two model files in `folder`."""
    backends = []
    for name, cost in (("target", table_cost(costs)), ("draft", lambda n: 0.02 * n)):
        backend = TimedBackend(scripted_model(lambda p: 1, 256), 256, clock, cost, pieces=BYTES)
        backend.path = folder / f"{name}.gguf"
        backend.path.write_bytes(b"GGUF")
        backends.append(backend)
    return ModelPair(*backends)


HARDWARE = HardwareOptions(threads=2)


def cached_entries() -> dict:
    return read_json_cache(costs_cache())


def test_a_probe_that_passes_its_checks_is_cached_and_reused(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)
    costs = pair_costs(pair, HARDWARE, kernels="k1")
    assert costs.trusted and costs.verify_seconds == pytest.approx(QUIET)
    assert list(cached_entries()) == [costs_key(pair, HARDWARE, "k1")]
    decodes = pair.target.decode_calls
    again = pair_costs(pair, HARDWARE, kernels="k1")
    assert pair.target.decode_calls == decodes  # not probed again
    assert again.origin == "cache (probe)" and again.verify_seconds == pytest.approx(QUIET)


def test_a_probe_that_fails_its_checks_is_not_cached(clock, tmp_path):
    costs = pair_costs(timed_pair(clock, BUSY, tmp_path), HARDWARE, kernels="k1")
    assert not costs.trusted
    assert cached_entries() == {}


def test_the_cache_is_keyed_by_kernels_threads_and_gpu_layers(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)
    keys = {
        costs_key(pair, HARDWARE, "k1"),
        costs_key(pair, HARDWARE, "k2"),
        costs_key(pair, HardwareOptions(threads=1), "k1"),
        costs_key(pair, HardwareOptions(threads=2, gpu_layers=-1), "k1"),
        costs_key(pair, HardwareOptions(threads=2, exact=False), "k1"),
    }
    assert len(keys) == 5


def test_the_cache_is_keyed_by_where_each_model_takes_its_choices(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)
    on_host = costs_key(pair, HARDWARE, "k1")
    pair.target.chooses_on_device = True  # only tokens come back: cheaper decodes on a GPU
    on_device = costs_key(pair, HARDWARE, "k1")
    pair.drafter.chooses_on_device = True
    assert len({on_host, on_device, costs_key(pair, HARDWARE, "k1")}) == 3


def test_what_a_run_learned_is_written_back_for_the_next(clock, tmp_path):
    pair = timed_pair(clock, BUSY, tmp_path)
    costs = pair_costs(pair, HARDWARE, kernels="k1")  # untrusted: not cached
    for n in (1, 2, 5, 9, 17, 33) * 4:  # the run's own decodes, at quiet costs
        costs.observe_verify(n, table_cost(QUIET)(n))
    remember_costs(pair, HARDWARE, costs, kernels="k1")
    start = pair_costs(pair, HARDWARE, kernels="k1")
    assert start.origin == "cache (learned)"
    learned = {n: start.verify_seconds[n] for n in QUIET}  # the probed sizes (64: extrapolated)
    assert learned == pytest.approx(QUIET, rel=0.2)


def test_a_write_back_keeps_other_keys_and_meets_a_concurrent_one_halfway(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)
    costs = pair_costs(pair, HARDWARE, kernels="k1")
    for _ in range(20):
        costs.observe_verify(1, 0.040)
    key = costs_key(pair, HARDWARE, "k1")
    entries = cached_entries()
    # Meanwhile another process wrote another key, and this key with 1 token at 60 ms.
    entries["other"] = {"measured_at": 1.0}
    entries[key] = {**entries[key], "measured_at": time.time() + 1}
    entries[key]["verify_seconds"]["1"] = 0.060
    write_json_cache(costs_cache(), entries)
    remember_costs(pair, HARDWARE, costs, kernels="k1")
    entries = cached_entries()
    assert entries["other"] == {"measured_at": 1.0}
    assert entries[key]["verify_seconds"]["1"] == pytest.approx((0.040 + 0.060) / 2)


def test_the_drafters_catch_up_price_is_cached_with_the_table(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)
    pair.drafter.cost = gpu_like_drafter
    price = CatchUpPrice(0.004, 0.001)
    first = pair_costs(pair, HARDWARE, kernels="k1").catch_up_price
    assert astuple(first) == pytest.approx(astuple(price))
    again = pair_costs(pair, HARDWARE, kernels="k1")
    assert again.origin == "cache (probe)"
    assert astuple(again.catch_up_price) == pytest.approx(astuple(price))
    # an entry written before catch-ups were measured: priced as before (CATCH_UP_COST)
    entries = cached_entries()
    del entries[costs_key(pair, HARDWARE, "k1")]["catch_up"]
    write_json_cache(costs_cache(), entries)
    older = pair_costs(pair, HARDWARE, kernels="k1")
    assert older.origin == "cache (probe)" and older.catch_up_price is None


def test_a_concurrent_write_back_of_the_catch_up_price_is_met_halfway(clock, tmp_path):
    pair = timed_pair(clock, QUIET, tmp_path)  # the drafter: 20 ms a token, a batch too
    costs = pair_costs(pair, HARDWARE, kernels="k1")
    for _ in range(20):
        costs.observe_verify(1, 0.046)
    costs.observe_catch_up(200, 0.02 + 200 * 0.010)  # this run's prompt: 10 ms a token
    key = costs_key(pair, HARDWARE, "k1")
    entries = cached_entries()
    entries[key] = {**entries[key], "measured_at": time.time() + 1, "catch_up": [0.0, 0.030]}
    write_json_cache(costs_cache(), entries)
    remember_costs(pair, HARDWARE, costs, kernels="k1")
    assert cached_entries()[key]["catch_up"] == pytest.approx([0.0, (0.010 + 0.030) / 2])


@pytest.mark.parametrize(
    ("draft", "mode", "label"),
    [
        (None, "none", None),
        (None, "ngram", "prompt lookup"),
        (Path("models/small-q4.gguf"), "combined", "small-q4 (combined)"),
    ],
)
def test_one_drafter_label_for_chat_and_serve(draft, mode, label):
    assert decode_request(draft=draft, drafter_mode=mode).drafter_label == label
