"""Exact mode: a prompt's logits must not depend on what an earlier request left in the cache.

A prompt's keys and logits depend on how it is cut into decodes; serve and chat keep the KV
cache of a common prefix, so without care the same request could be answered differently
after another one. Exact mode cuts every prompt at fixed positions (llama/library.py's
PROMPT_CHUNK) and keeps only cached chunks cut that way; or, where the invariant kernels are
as cheap for prompts (library.invariant_prompts), decodes prompts with them too and
keeps every cached token. Both ways are tested (the exact_prompts fixture). Each test
brings a backend into some cached state, then decodes the prompt, and compares the last
row's logits with a fresh backend's bit for bit; the default kernels, which reuse any cached
prefix, are the control.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.decoding.backend import logits_for_suffix
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend

TEXT = "the cat sat on the mat and then it went away the dog ran over the hill " * 3
CHUNK = 16  # small chunks, so short prompts cross several


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(library, "PROMPT_CHUNK", CHUNK)


def cached_states(prompt: list[int]) -> dict[str, list[tuple[list[int], bool]]]:
    """Ways an earlier request can leave the cache: (tokens, decoded as a prompt?) in order."""
    other = [t for t in reversed(prompt[10:30])]
    return {
        "a shorter prompt": [(prompt[:23], True)],
        "a prompt ending on a chunk boundary": [(prompt[: 2 * CHUNK], True)],
        "the prompt but its last token": [(prompt[:-1], True)],
        "a prompt, then its answer one token at a time": [(prompt[:20], True)]
        + [([t], False) for t in prompt[20:41]],
        "a prompt that parts from this one": [(prompt[:37] + other, True)],
        "the same prompt": [(prompt, True)],
    }


def last_logits(backend: LlamaBackend, prompt: list[int]) -> np.ndarray:
    return np.array(logits_for_suffix(backend, prompt, 1, prompt=True)[0])


def logits_after(backend: LlamaBackend, state, prompt: list[int]) -> np.ndarray:
    backend.truncate(0)
    for tokens, as_prompt in state:
        if as_prompt:
            logits_for_suffix(backend, tokens, 1, prompt=True)
        else:
            backend.decode(tokens, len(tokens))
    return last_logits(backend, prompt)


def states_that_differ(tiny_models, exact: bool) -> list[str]:
    fresh = LlamaBackend(tiny_models.target, n_ctx=512, n_threads=2, exact=exact)
    warm = LlamaBackend(tiny_models.target, n_ctx=512, n_threads=2, exact=exact)
    try:
        prompt = fresh.tokenize(TEXT, add_special=True)
        assert len(prompt) > 3 * CHUNK
        reference = last_logits(fresh, prompt)
        return [
            name
            for name, state in cached_states(prompt).items()
            if not np.array_equal(logits_after(warm, state, prompt), reference)
        ]
    finally:
        fresh.close()
        warm.close()


def test_an_exact_prompt_gives_the_same_logits_whatever_was_cached(tiny_models, exact_prompts):
    assert states_that_differ(tiny_models, exact=True) == []


def test_reusing_any_cached_prefix_changes_the_logits(tiny_models):
    # the control: fast mode keeps every cached token and decodes only the rest
    assert states_that_differ(tiny_models, exact=False) != []


def test_an_exact_prompt_keeps_the_cached_chunks_it_can(tiny_models, exact_prompts):
    backend = LlamaBackend(tiny_models.target, n_ctx=512, n_threads=2, exact=True)
    try:
        prompt = backend.tokenize(TEXT, add_special=True)
        logits_for_suffix(backend, prompt[:40], 1, prompt=True)  # chunks 0-16, 16-32, 32-40
        backend.decode(prompt[40:44], 4)  # an answer's tokens, as generated
        before = backend.tokens_decoded
        logits_for_suffix(backend, prompt[:50], 1, prompt=True)
        if exact_prompts == "aligned":
            assert backend.tokens_decoded - before == 50 - 2 * CHUNK  # 32-50 again, not 0-32
        else:  # every token was decoded with the invariant kernels: all are kept
            assert backend.tokens_decoded - before == 50 - 44
    finally:
        backend.close()


def test_a_prompt_with_rows_after_it_gives_its_logits_alone_where_the_target_says_so(
    tiny_models, exact_prompts
):
    # prompt_with_drafts: the engine verifies forced text in the prompt's own pass only where
    # the prompt's last row is then computed as it is alone (the invariant prompt kernels).
    alone, along = (LlamaBackend(tiny_models.target, n_ctx=512, n_threads=2, exact=True)
                    for _ in range(2))  # fmt: skip
    try:
        prompt = alone.tokenize(TEXT, add_special=True)
        rows = prompt[5:12]  # a draft after the prompt
        reference = last_logits(alone, prompt)
        first = np.array(logits_for_suffix(along, prompt + rows, len(rows) + 1, prompt=True)[0])
        assert along.prompt_with_drafts == (exact_prompts == "invariant")
        assert np.array_equal(first, reference) or not along.prompt_with_drafts
    finally:
        alone.close()
        along.close()
