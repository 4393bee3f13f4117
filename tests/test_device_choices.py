"""Greedy choices taken by the device that computes the logits (llama/device_choices.py):
a greedy sampler in the decode's graph (llama.cpp's, or specdec's with each choice's
probability, for a drafter), so that a GPU sends back one token a row instead of the row. It
is switched on here for the CPU, whose backend runs the samplers as a GPU's does: the device
must choose what the host's argmax of the same rows chooses, with the probability the host
computes, answers must be the host's, and the rows must come back whenever logits are
wanted again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from specdec_cli.decoding.backend import ArgmaxRows, choices_for_suffix
from specdec_cli.decoding.costs import measure_costs
from specdec_cli.decoding.drafters import ModelDrafter
from specdec_cli.decoding.engine import Finished, Generation, GenerationSettings
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.decoding.text_drafter import TextDrafter
from specdec_cli.errors import BadUsageError
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.device_choices import DeviceChoices
from specdec_cli.llama.exactness import padded_rows

CONTEXT = "the cat sat on the mat and then it went away " * 3
CONTINUATION = "the dog ran over the hill and far away and the cat sat on the mat"


def exact_backend(path, device: bool, padding: int = 1) -> LlamaBackend:
    return LlamaBackend(
        path, n_ctx=256, n_threads=2, exact=True, verify_padding=padding, device_choices=device
    )


def count_calls(owner: object, method: str, calls: list[tuple]) -> None:
    """`owner`'s `method` notes each call's arguments in `calls`."""
    original = getattr(owner, method)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    setattr(owner, method, counted)


def device_choices_counted(backend: LlamaBackend) -> Callable[[], int]:
    """How many choices the backend's device sampler has sent back so far."""
    calls: list[tuple] = []
    count_calls(backend._device_sampler, "choices", calls)
    return lambda: sum(n_rows for _, n_rows in calls)


@pytest.mark.parametrize("padding", [1, 8])
def test_the_device_chooses_each_rows_argmax(tiny_models, padding):
    host, device = (exact_backend(tiny_models.target, on, padding) for on in (False, True))
    counted = device_choices_counted(device)
    try:
        context = host.tokenize(CONTEXT, add_special=True)
        tokens = host.tokenize(CONTINUATION, add_special=False)
        chosen = [list(choices_for_suffix(b, context, 1, prompt=True)) for b in (host, device)]
        assert chosen[0] == chosen[1]
        widths = (3, 1, 8, 5, 2)
        for n in widths:  # as a run's verifications come, each after the last
            batch, tokens = tokens[:n], tokens[n:]
            expected = [int(np.argmax(row)) for row in host.decode(batch, n)]
            assert list(device.decode_choices(batch, n)) == expected
            assert device.cached == host.cached  # a padding's cells are gone
            chosen.append(expected)
        # every choice was the device's (a padded verification's padding rows' too)
        assert counted() == 1 + sum(padded_rows(n, padding) for n in widths)
        assert len({token for rows in chosen for token in rows}) > 3  # they tell rows apart
    finally:
        host.close()
        device.close()


@contextmanager
def host_and_device(path) -> Iterator[tuple[LlamaBackend, LlamaBackend, list[int]]]:
    """The model twice, its choices the host's and the device's, each after CONTEXT; and
    CONTINUATION's tokens."""
    host, device = (exact_backend(path, on) for on in (False, True))
    try:
        for backend in (host, device):
            backend.decode(backend.tokenize(CONTEXT, add_special=True), 1, prompt=True)
        yield host, device, host.tokenize(CONTINUATION, add_special=False)
    finally:
        host.close()
        device.close()


def test_logits_come_back_after_choices(tiny_models):
    with host_and_device(tiny_models.target) as (host, device, tokens):
        device.decode_choices(tokens[:4], 4)
        host.decode(tokens[:4], 4)
        expected = np.array(host.decode(tokens[4:8], 4))
        assert np.array_equal(device.decode(tokens[4:8], 4), expected)
        assert isinstance(device.decode_choices(tokens[8:10], 2), DeviceChoices)  # again


def test_a_drafters_choices_come_with_the_probabilities_the_host_computes(tiny_models):
    with host_and_device(tiny_models.close_drafter) as (host, device, tokens):
        sure = []
        for token in tokens:  # a drafter's steps, with a plain choice (a verification) between
            expected = ArgmaxRows(host.decode([token], 1))
            got = device.decode_choices([token], 1, with_confidence=True)
            assert isinstance(got, DeviceChoices) and got[0] == expected[0]
            assert got.confidence(0) == pytest.approx(expected.confidence(0), rel=1e-5)
            sure.append(got.confidence(0))
            if token == tokens[3]:
                assert isinstance(device.decode_choices([token], 1), DeviceChoices)
                host.decode([token], 1)
        assert min(sure) < 0.9 * max(sure)  # rows that tell them apart


def answer(
    target: LlamaBackend,
    drafter_path,
    settings: GenerationSettings,
    device: bool = False,
    by_text: bool = False,
) -> list[int]:
    """The answer, from a drafter (by text: TextDrafter) whose choices are the device's too
    where `device`: with their probabilities for a greedy answer (drafts are planned by
    them; a text drafter's are always its argmax)."""
    drafter_backend = LlamaBackend(drafter_path, n_ctx=256, n_threads=2, device_choices=device)
    try:
        prompt = target.tokenize(CONTEXT, add_special=True)
        target.truncate(0)
        drafter: ModelDrafter | TextDrafter = (
            TextDrafter(drafter_backend, target) if by_text else ModelDrafter(drafter_backend)
        )
        events = Generation(target, prompt, settings, drafter=drafter).events()
        tokens = [event for event in events if isinstance(event, Finished)][-1].tokens
        if device:
            assert drafter_backend._device_sampler is not None
            chose = drafter_backend._device_sampler.with_confidence
            assert chose is (True if by_text or settings.sampling.greedy else None)
        return tokens
    finally:
        drafter_backend.close()


def test_answers_are_the_hosts_greedy_and_sampled_in_turn(tiny_models):
    """Greedy answers take the device's choices; a sampled one in between wants logits,
    and the greedy one after it takes the device's choices again."""
    greedy = GenerationSettings(max_tokens=40, draft_max=5)
    sampled = GenerationSettings(
        max_tokens=40, draft_max=5, sampling=SamplingSettings(temperature=0.8), seed=7
    )
    host, device = (exact_backend(tiny_models.target, on, 8) for on in (False, True))
    counted = device_choices_counted(device)
    try:
        for settings in (greedy, sampled, greedy):
            before = counted()
            expected = answer(host, tiny_models.close_drafter, settings)
            got = answer(device, tiny_models.close_drafter, settings, device=True)
            assert got == expected
            chose = counted() > before
            assert chose == settings.sampling.greedy
    finally:
        host.close()
        device.close()


def test_text_drafts_from_the_devices_choices_give_the_hosts_answer(tiny_models):
    settings = GenerationSettings(max_tokens=40, draft_max=5)
    target = exact_backend(tiny_models.target, False)
    try:
        expected = answer(target, tiny_models.close_drafter, settings, by_text=True)
        got = answer(target, tiny_models.close_drafter, settings, device=True, by_text=True)
        assert got == expected
    finally:
        target.close()


@pytest.mark.parametrize("sequences", [1, 2])
def test_a_split_contexts_sequences_read_logits(tiny_models, sequences):
    """Their rows come back from rounds shared with other sequences (serve --parallel)."""
    backend = exact_backend(tiny_models.target, True)
    assert backend.chooses_on_device
    try:
        views = backend.split(sequences)
        assert not any(view.chooses_on_device for view in views)
        tokens = views[0].tokenize(CONTEXT, add_special=True)
        assert isinstance(views[0].decode_choices(tokens, 1, prompt=True), ArgmaxRows)
    finally:
        backend.close()


def test_the_choice_is_the_backends_own_unless_set_to_measure(tiny_models, monkeypatch):
    def chooses() -> bool:
        backend = LlamaBackend(tiny_models.target, n_ctx=64, n_threads=2)
        try:
            return backend.chooses_on_device
        finally:
            backend.close()

    monkeypatch.delenv("SPECDEC_DEVICE_CHOICES", raising=False)
    assert not chooses()  # on a CPU the host's argmax is cheaper (CHOICES_ON_DEVICE)
    monkeypatch.setenv("SPECDEC_DEVICE_CHOICES", "1")
    assert chooses()
    monkeypatch.setenv("SPECDEC_DEVICE_CHOICES", "yes")
    with pytest.raises(BadUsageError, match="SPECDEC_DEVICE_CHOICES must be 1"):
        chooses()


def test_the_cost_probe_reads_as_a_greedy_run_reads(tiny_models):
    """Choices (a drafter's with their probabilities), never logits: the probe times what a
    greedy run's decodes cost, and leaves the samplers it will use attached."""
    target = exact_backend(tiny_models.target, True)
    drafter = exact_backend(tiny_models.close_drafter, True)
    logits_read: list[tuple] = []
    for backend in (target, drafter):
        count_calls(backend, "decode", logits_read)
    try:
        probe = target.tokenize(CONTEXT * 3, add_special=True)
        measure_costs(target, drafter, probe)
        assert logits_read == []
        assert target._device_sampler is not None and drafter._device_sampler is not None
        assert target._device_sampler.with_confidence is False
        assert drafter._device_sampler.with_confidence is True
    finally:
        target.close()
        drafter.close()
