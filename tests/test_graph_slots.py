"""Patch 0005 (patches/llama.cpp/0005-graph-per-shape.patch): a context keeps a graph for
each small decode shape, so that a speculative run's alternating steps and verifications
reuse their graphs instead of rebuilding them at every change, with the logits a graph built
anew gives. SPECDEC_GRAPH_SLOTS, read when a context is made, says how many shapes it keeps."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tiny_gguf import padded_vocab, write_tiny_llama

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


# A child process loads a model whose 64 rows of logits take 25 MB, then decodes 64 tokens
# with little address space left (RLIMIT_AS): room for a new slot's scheduler, as much as
# the first slot (8 rows) took, but not for the compute buffers 64 rows need, as on a GPU
# whose memory the model and its cache fill. It prints the digests of each 64-row decode's
# logits. Its one-time allocations (llama.cpp's output rows for 100 tokens) come before.
SLOT_MEMORY_CHILD = """
import hashlib, json, resource, sys
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend

library.set_verbose(True)
backend = LlamaBackend(sys.argv[1], n_ctx=256, n_threads=1)
context = backend.tokenize("the cat sat on the mat", add_special=True)
words = backend.tokenize("the dog ran over the hill and far away " * 20, add_special=False)
backend.decode(context, 1)
backend.decode(words[:100], 100)
backend.truncate(len(context))


def address_space():
    status = open("/proc/self/status").read()
    return int(status.split("VmSize:")[1].split()[0]) * 1024


before_first_slot = address_space()
backend.decode(words[:8], 8)
first_slot = address_space() - before_first_slot
if sys.argv[2] == "limited":
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (address_space() + first_slot + 8 * 2**20, hard))
digests = []
for width in (64, 1, 64, 8, 64):
    backend.truncate(len(context))
    logits = backend.decode(words[:width], width)
    if width == 64:
        digests.append(hashlib.sha256(memoryview(logits)).hexdigest())
print(json.dumps(digests))
"""


def run_slot_memory_child(model, limited: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SLOT_MEMORY_CHILD, str(model), "limited" if limited else "free"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_slot_without_memory_for_its_buffers_gives_way_to_the_reserved_graph(tmp_path):
    """A full device must not fail a decode that llama.cpp alone would run: the slot that
    cannot allocate is given up and the decode runs in the reserved scheduler, with the same
    logits."""
    model = write_tiny_llama(tmp_path / "wide.gguf", vocab=padded_vocab(100_000), dtype=np.float16)
    free = run_slot_memory_child(model, limited=False)
    limited = run_slot_memory_child(model, limited=True)
    assert free.returncode == 0, free.stderr[-2000:]
    assert limited.returncode == 0, limited.stderr[-2000:]
    assert "no memory for a graph slot" in limited.stderr  # the limit did bite
    assert "no memory for a graph slot" not in free.stderr
    assert json.loads(limited.stdout) == json.loads(free.stdout)
