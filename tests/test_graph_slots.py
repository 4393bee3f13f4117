"""Patch 0005 (patches/llama.cpp/0005-graph-per-shape.patch): a context keeps a graph for
each small decode shape, so that a speculative run's alternating steps and verifications
reuse their graphs instead of rebuilding them at every change, with the logits a graph built
anew gives. SPECDEC_GRAPH_SLOTS, read when a context is made, says how many shapes it keeps."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.llama.backend import LlamaBackend

CONTEXT = "the cat sat on the mat and then it went away " * 3
CONTINUATION = "the dog ran over the hill and far away"
ROUNDS = 6


def exact_backend(path) -> LlamaBackend:
    return LlamaBackend(path, n_ctx=256, n_threads=2, exact=True)


def decodes(backend: LlamaBackend, widths) -> tuple[list[np.ndarray], int]:
    """Each width's tokens decoded after the same context, in order: their logits, and how
    many of those decodes reused a graph."""
    context = backend.tokenize(CONTEXT, add_special=True)
    tokens = backend.tokenize(CONTINUATION, add_special=False)
    backend.decode(context, 1)
    reused_before = backend.graphs_reused()
    logits = []
    for width in widths:
        backend.truncate(len(context))
        logits.append(np.array(backend.decode(tokens[:width], width)))
    return logits, backend.graphs_reused() - reused_before


def test_alternating_steps_and_verifications_reuse_their_graphs(tiny_models):
    backend = exact_backend(tiny_models.target)
    try:
        _, reused = decodes(backend, (1, 8) * ROUNDS)
    finally:
        backend.close()
    assert reused == 2 * ROUNDS - 2  # each shape builds its graph once


def test_without_slots_every_change_of_shape_rebuilds(tiny_models, monkeypatch):
    """llama.cpp's single graph, the control: the count sees rebuilds."""
    monkeypatch.setenv("SPECDEC_GRAPH_SLOTS", "0")
    backend = exact_backend(tiny_models.target)
    try:
        _, reused = decodes(backend, (1, 8) * ROUNDS)
    finally:
        backend.close()
    assert reused == 0


@pytest.mark.parametrize(("slots", "reused"), [(3, 3 * ROUNDS - 3), (2, 0)])
def test_a_context_keeps_as_many_shapes_as_it_has_slots(tiny_models, monkeypatch, slots, reused):
    """Three shapes in turn: three slots keep them all; two evict, least recent first, the
    very graph the next decode needs."""
    monkeypatch.setenv("SPECDEC_GRAPH_SLOTS", str(slots))
    backend = exact_backend(tiny_models.target)
    try:
        _, got = decodes(backend, (1, 2, 8) * ROUNDS)
    finally:
        backend.close()
    assert got == reused


def test_kept_graphs_give_the_logits_of_graphs_built_anew(tiny_models, monkeypatch):
    widths = (1, 8, 3, 1, 8, 2, 5, 4, 6, 7, 9, 1, 3, 8)  # more shapes than slots: evictions too
    kept = exact_backend(tiny_models.target)
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    built_anew = exact_backend(tiny_models.target)
    try:
        kept_logits, kept_reused = decodes(kept, widths)
        new_logits, new_reused = decodes(built_anew, widths)
    finally:
        kept.close()
        built_anew.close()
    assert new_reused == 0 and kept_reused >= 2  # at least the second 1 and the second 8
    for width, got, expected in zip(widths, kept_logits, new_logits, strict=True):
        assert np.array_equal(got, expected), f"a decode of {width} tokens"
