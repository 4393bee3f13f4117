"""The llama.cpp backend on tiny GGUF models: batching, rollback, tokens, templates."""

from __future__ import annotations

import numpy as np
import pytest
from surface import surface_differences
from tiny_gguf import BOS_ID, EOS_ID, byte_token_id, write_tiny_llama

from specdec_cli.decoding.backend import Backend, CacheAgreement, logits_for_suffix
from specdec_cli.errors import (
    ContextOverflowError,
    DecodeError,
    IncompatibleModelsError,
    ModelFileError,
)
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.batches import chunk_bounds, decode_failure
from specdec_cli.models.compat import check_compatible


@pytest.fixture(scope="module")
def target(tiny_models):
    backend = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2)
    yield backend
    backend.close()


def _prompt(backend) -> list[int]:
    return backend.tokenize("the cat sat on the mat and then it", add_special=True)


def test_the_backend_has_the_protocols_surface(target):
    assert surface_differences(target, Backend) == []


def test_batched_rows_match_one_token_decodes(target):
    prompt = _prompt(target)
    target.truncate(0)
    batched = np.array(target.decode(prompt, 4))
    target.truncate(0)
    target.decode(prompt[:-4], 1)
    one_by_one = [np.array(target.decode([token], 1)[0]) for token in prompt[-4:]]
    # llama.cpp's batched and one-token kernels sum in other orders (by how much depends on
    # the CPU: up to 0.008 here with AVX2); a row read from the wrong place is off by units
    np.testing.assert_allclose(batched, np.stack(one_by_one), atol=0.05)


def test_long_input_is_decoded_in_chunks(tiny_models, target):
    small_batches = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2, n_batch=8)
    prompt = _prompt(target) * 2
    target.truncate(0)
    expected = np.array(target.decode(prompt, 3))
    got = np.array(small_batches.decode(prompt, 3))
    assert small_batches.decode_calls == -(-len(prompt) // 8)
    np.testing.assert_allclose(got, expected, atol=1e-3)
    small_batches.close()


def test_truncate_rolls_back_the_cache(target):
    prompt = _prompt(target)
    target.truncate(0)
    first = np.array(target.decode(prompt, 1))
    target.decode([5, 6, 7], 1)
    target.truncate(len(prompt) - 1)
    assert target.cached == prompt[:-1]
    again = np.array(target.decode(prompt[-1:], 1))
    np.testing.assert_allclose(again, first, atol=1e-4)


def test_logits_for_suffix_decodes_only_what_is_new(target):
    prompt = _prompt(target)
    target.truncate(0)
    logits_for_suffix(target, prompt, 1)
    before = target.tokens_decoded
    logits_for_suffix(target, [*prompt, 10, 11], 2)
    assert target.tokens_decoded - before == 2
    before = target.tokens_decoded
    logits_for_suffix(target, [*prompt, 10, 12], 1)  # diverges at the last token: one redo
    assert target.tokens_decoded - before == 1
    assert target.cached == [*prompt, 10, 12]


def test_an_agreement_with_the_cache_sees_another_callers_truncation(target):
    # another caller cuts the cache and decodes other tokens to the same length: the first
    # caller's next call compares again rather than keep what it was told of
    prompt = _prompt(target)
    target.truncate(0)
    agreement = CacheAgreement()
    logits_for_suffix(target, prompt, 1, agreement=agreement)
    target.truncate(len(prompt) - 3)
    target.decode([5, 6, 7], 1)
    rows = np.array(logits_for_suffix(target, [*prompt, 10], 1, agreement=agreement))
    assert target.cached == [*prompt, 10]
    target.truncate(0)
    np.testing.assert_allclose(rows, logits_for_suffix(target, [*prompt, 10], 1), atol=1e-4)


def test_decoding_past_the_context_is_a_clear_error(target):
    target.truncate(0)
    with pytest.raises(ContextOverflowError, match="context"):
        target.decode([BOS_ID] + [300] * 300, 1)
    assert target.cached == []


def test_a_full_kv_cache_is_a_context_overflow(target):
    target.truncate(0)
    with pytest.raises(ContextOverflowError, match="no room in the KV cache.*--ctx-size"):
        while True:  # past decode()'s own check, straight to llama_decode
            target._decode_chunk([300] * 60, 1, invariant=False)
    assert target.decode([300], 1).shape == (1, target.n_vocab)  # the cache is still usable


def test_an_invalid_batch_is_not_called_a_context_overflow(target):
    target.truncate(0)
    with pytest.raises(DecodeError, match="invalid") as failure:
        target.decode([BOS_ID, target.n_vocab + 5], 1)
    assert not isinstance(failure.value, ContextOverflowError)
    assert "--ctx-size" not in str(failure.value)
    assert target.cached == []


@pytest.mark.parametrize(
    ("status", "kind", "says"),
    [
        (1, ContextOverflowError, "--ctx-size"),
        (2, DecodeError, "aborted"),
        (-1, DecodeError, "invalid"),
        (-3, DecodeError, "status -3"),
    ],
)
def test_each_decode_status_says_what_happened(status, kind, says):
    error = decode_failure(status, position=7, n_ctx=64)
    assert type(error) is kind and says in str(error) and "position 7" in str(error)
    assert ("--ctx-size" in str(error)) == (status == 1)


def test_trained_length_and_a_resized_context(tiny_models):
    backend = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=1)
    assert backend.n_ctx_train == 512  # tiny_gguf's context_length
    backend.decode([BOS_ID, 300], 1)
    backend.resize_context(512)
    assert (backend.n_ctx, backend.cached) == (512, [])
    assert backend.decode([BOS_ID] + [300] * 400, 1).shape == (1, backend.n_vocab)
    backend.close()


def test_tokens_bytes_and_end_of_generation(target):
    tokens = target.tokenize("é", add_special=False)
    assert [byte_token_id(0xC3), byte_token_id(0xA9)] == tokens[-2:]
    assert b"".join(target.token_bytes(t) for t in tokens).strip() == "é".encode()
    assert target.is_end_of_generation(EOS_ID)
    assert target.is_end_of_generation(target.tokenize("<|im_end|>", False, True)[-1])
    assert not target.is_end_of_generation(tokens[-1])


def test_chat_template_from_the_gguf(target):
    text = target.format_chat([{"role": "user", "content": "hi"}])
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_missing_chat_template_suggests_raw(tmp_path):
    path = write_tiny_llama(tmp_path / "plain.gguf", chat_template=False)
    backend = LlamaBackend(path, n_ctx=64, n_threads=1)
    with pytest.raises(ModelFileError, match="--raw"):
        backend.format_chat([{"role": "user", "content": "hi"}])


def test_missing_and_non_gguf_files_are_refused(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        LlamaBackend(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        LlamaBackend(junk)


def test_truncated_gguf_is_refused(tiny_models, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_models.target.read_bytes()[:50_000])
    with pytest.raises(ModelFileError, match="could not load"):
        LlamaBackend(cut)


@pytest.mark.parametrize("drafter", ["close_drafter", "padded_drafter", "gqa_drafter"])
def test_compatible_drafters_pass(tiny_models, target, drafter):
    other = LlamaBackend(getattr(tiny_models, drafter), n_ctx=64, n_threads=1)
    check_compatible(target, other)


def test_incompatible_vocabulary_names_the_first_differing_token(tiny_models, target):
    other = LlamaBackend(tiny_models.incompatible, n_ctx=64, n_threads=1)
    with pytest.raises(IncompatibleModelsError, match=r"token 2\d\d is '.*' for the target"):
        check_compatible(target, other)


def test_vocabulary_size_difference_over_128_is_incompatible(tiny_models, target):
    other = LlamaBackend(tiny_models.oversized, n_ctx=64, n_threads=1)
    with pytest.raises(IncompatibleModelsError, match="at most 128 apart"):
        check_compatible(target, other)


@pytest.mark.parametrize(
    ("n_tokens", "n_last", "bounds"),
    [
        (10, 1, [0, 10]),
        (1000, 1, [0, 500, 1000]),  # equal halves, not 488 + 512
        (530, 1, [0, 265, 530]),  # no 18-token chunk for the slow invariant kernels
        (600, 400, [0, 88, 600]),  # the rows asked for must all be in the last chunk
    ],
)
def test_long_inputs_are_cut_into_equal_chunks(n_tokens, n_last, bounds):
    assert chunk_bounds(n_tokens, 512, n_last) == bounds
