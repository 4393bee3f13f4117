"""Exact mode: a token's logits must not depend on how many tokens share its decode.

Each test decodes a context, then the same tokens one at a time and in one batch of every
size from 1 to the largest verification batch, and compares the logits bit for bit. The
control, a backend made batch-dependent by one ulp (BatchDependent), shows that these
tests can fail, whatever llama.cpp's own kernels do on this CPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli.build_flags import cpu_flags, rowwise_isa
from specdec_cli.cli import app
from specdec_cli.decoding.policy import ADAPTIVE_DRAFT_LIMIT
from specdec_cli.errors import ModelFileError
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend

LARGEST_BATCH = ADAPTIVE_DRAFT_LIMIT + 1  # a full draft and the target's own token
CONTEXT = "the cat sat on the mat and then it went away " * 3
CONTINUATION = "the dog ran over the hill and far away " * 8


def batch_sizes_that_differ(
    backend: LlamaBackend, largest: int = LARGEST_BATCH, continuation: str = CONTINUATION
) -> list[int]:
    """Batch sizes n whose logits for the first n tokens differ from one-token decodes."""
    context = backend.tokenize(CONTEXT, add_special=True)
    tokens = backend.tokenize(continuation, add_special=False)[:largest]
    assert len(tokens) == largest
    backend.truncate(0)
    backend.decode(context, 1)
    alone = np.stack([np.array(backend.decode([token], 1)[0]) for token in tokens])
    differ = []
    for n in range(1, largest + 1):
        backend.truncate(len(context))
        batched = np.array(backend.decode(tokens[:n], n))
        if not np.array_equal(batched, alone[:n]):
            differ.append(n)
    return differ


class BatchDependent:
    """A backend made batch-dependent on purpose: a batched decode moves one logit of its
    last row by one ulp. The control for these tests, on any CPU: the comparison must see
    it at every batch size (llama.cpp's own kernels are batch-dependent on the CPUs seen so
    far, but whether they are is the CPU's business, not specdec's)."""

    def __init__(self, inner: LlamaBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decode(self, tokens, n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        rows = np.array(self.inner.decode(tokens, n_logit_rows, prompt))
        if len(tokens) > 1:
            rows[-1, 0] = np.nextafter(rows[-1, 0], np.float32(np.inf))
        return rows


def assert_batch_invariant(path, threads: int, largest: int, control: bool = False) -> None:
    """A real model in exact mode over batch sizes 1..largest: none differ; or, as the
    control, the same backend made batch-dependent by one ulp: every size above 1 differs."""
    backend = LlamaBackend(path, n_ctx=512, n_threads=threads, exact=True)
    try:
        checked = BatchDependent(backend) if control else backend
        differ = batch_sizes_that_differ(checked, largest, LONG_CONTINUATION)  # type: ignore[arg-type]
    finally:
        backend.close()
    expected = list(range(2, largest + 1)) if control else []
    assert differ == expected, f"batch sizes whose logits differ: {differ}"


@pytest.mark.parametrize(
    "model", ["target", "gqa_drafter", "mqa_target"], ids=["f32", "f16-gqa", "specdec-attention"]
)
def test_exact_backend_logits_are_bitwise_the_same_at_every_batch_size(tiny_models, model):
    backend = LlamaBackend(getattr(tiny_models, model), n_ctx=256, n_threads=2, exact=True)
    try:
        assert batch_sizes_that_differ(backend) == []
    finally:
        backend.close()


@pytest.mark.parametrize("model", ["target", "gqa_drafter"], ids=["f32", "f16-gqa"])
def test_a_batch_dependence_of_one_ulp_is_seen_at_every_batch_size(tiny_models, model):
    backend = LlamaBackend(getattr(tiny_models, model), n_ctx=256, n_threads=2, exact=True)
    try:
        differ = batch_sizes_that_differ(BatchDependent(backend))  # type: ignore[arg-type]
        assert differ == list(range(2, LARGEST_BATCH + 1))
    finally:
        backend.close()


# --- K-quant weights: specdec's row-wise kernels (native/rowwise/, patch 0002) ----------------

EXACT_BATCH_ROWS = library.EXACT_BATCH_ROWS  # every batch size exact mode may decode
LONG_CONTINUATION = CONTINUATION * 2


def _this_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return cpu_flags(cpuinfo.read())
    except OSError:
        return set()


def test_this_build_has_the_rowwise_kernels_for_this_cpu():
    # on x86 with AVX-512 VNNI or AVX2 (this project's machines) the K-quant tests below run
    # them; elsewhere exact mode keeps llama.cpp's one-row kernels, still invariant
    assert library.rowwise_kernels() == rowwise_isa(_this_cpu_flags())


# the quantised tiny targets: every weight type specdec has row-wise kernels for
QUANTISED_TARGETS = ["kquant_target", "q5_k_target", "q8_0_target", "q5_0_target"]


@pytest.mark.parametrize("target", QUANTISED_TARGETS)
@pytest.mark.parametrize("threads", [1, 2])
def test_quantised_logits_are_bitwise_the_same_at_every_batch_size_up_to_64(
    tiny_models, target, threads
):
    backend = LlamaBackend(getattr(tiny_models, target), n_ctx=512, n_threads=threads, exact=True)
    try:
        assert batch_sizes_that_differ(backend, EXACT_BATCH_ROWS, LONG_CONTINUATION) == []
    finally:
        backend.close()


@pytest.mark.parametrize("target", QUANTISED_TARGETS)
def test_a_quantised_batch_dependence_of_one_ulp_is_seen(tiny_models, target):
    assert_batch_invariant(getattr(tiny_models, target), 2, EXACT_BATCH_ROWS, control=True)


@pytest.fixture
def llama_cpps_attention():
    """Exact mode's attention on llama.cpp's one-row path instead of specdec's kernel, for the
    test's duration."""
    assert library.use_specdec_attention(False)
    yield
    library.use_specdec_attention(True)


def exact_and_llama_cpps_rows(path) -> list[np.ndarray]:
    """Eight tokens after a context: exact mode's logits, decoded in one batch, and llama.cpp's
    kernels' (--fast), one token at a time. Both read the context as llama.cpp's kernels
    compute it (not the invariant prompt kernels)."""
    exact = LlamaBackend(path, n_ctx=256, n_threads=2, exact=True)
    fast = LlamaBackend(path, n_ctx=256, n_threads=2, exact=False)
    try:
        context = exact.tokenize(CONTEXT, add_special=True)
        tokens = exact.tokenize(CONTINUATION, add_special=False)[:8]
        exact.decode(context, 1)
        fast.decode(context, 1)
        return [
            np.array(exact.decode(tokens, len(tokens))),
            np.array([np.array(fast.decode([token], 1))[0] for token in tokens]),
        ]
    finally:
        exact.close()
        fast.close()


@pytest.mark.parametrize("target", QUANTISED_TARGETS)
def test_quantised_exact_logits_agree_with_llama_cpps_kernels(
    tiny_models, target, monkeypatch, llama_cpps_attention
):
    # Same quantised weights and activations, other kernels: only the float summation order
    # differs, so the logits agree closely (a misread block layout would not). llama.cpp's
    # side decodes one token at a time: its batched Q5_K kernels part from its own one-token
    # ones by up to 1.4% of the logits' range on this model (seen on an AVX-512 CPU). Attention
    # takes the same path on both sides (specdec's kernel is checked below).
    monkeypatch.setattr(library, "_invariant_prompts", False)
    rows = exact_and_llama_cpps_rows(getattr(tiny_models, target))
    scale = float(np.abs(rows[1]).max())
    difference = np.abs(rows[0] - rows[1])
    # Float order alone gives differences near 1e-7 of the range, now and then amplified
    # where a value sits on a rounding boundary of the next layer's 8-bit activations (one
    # row of the Q5_0 model: 1.2% of the range); a misread layout moves every row.
    assert float(np.median(difference)) <= 1e-5 * scale
    assert (difference.max(axis=1) <= 1e-3 * scale).mean() >= 0.75
    assert (rows[0].argmax(axis=1) == rows[1].argmax(axis=1)).all()


def test_exact_modes_attention_is_specdecs_kernel_and_agrees_with_llama_cpps(
    tiny_models, monkeypatch
):
    # The kernel computes exact mode's attention: with it the logits are not llama.cpp's one-row
    # path's bits. They stay as close as that path's own rounding allows: it adds the values in
    # FP16 (a relative error near 2^-11 a key, here up to 0.5% of the logits' range after two
    # layers), where the kernel adds them in FP32 (within 3e-6 of the double-precision result,
    # native/rowwise/test_attention.c). A misread layout or head would move every row.
    monkeypatch.setattr(library, "_invariant_prompts", False)
    path = tiny_models.mqa_target  # four query heads to a KV head: the kernel takes it
    with_kernel = exact_and_llama_cpps_rows(path)[0]
    assert library.use_specdec_attention(False)
    try:
        with_one_row_path = exact_and_llama_cpps_rows(path)[0]
    finally:
        library.use_specdec_attention(True)
    scale = float(np.abs(with_one_row_path).max())
    difference = np.abs(with_kernel - with_one_row_path)
    assert float(difference.max()) > 0
    assert float(np.median(difference)) <= 1e-2 * scale
    assert (with_kernel.argmax(axis=1) == with_one_row_path.argmax(axis=1)).all()


def test_exact_and_fast_backends_share_one_process(tiny_models):
    # The kernel switch is process-wide; each backend sets it for its own decodes.
    exact = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2, exact=True)
    fast = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2, exact=False)
    try:
        fast.decode(fast.tokenize(CONTEXT, add_special=True), 1)
        assert batch_sizes_that_differ(exact, 8) == []
        assert batch_sizes_that_differ(fast, 8) != []
    finally:
        exact.close()
        fast.close()


def test_exact_mode_refuses_a_build_without_the_patch(tiny_models, monkeypatch):
    monkeypatch.setattr(library._exactness, "_switches", {})
    with pytest.raises(ModelFileError, match="batch-invariant"):
        LlamaBackend(tiny_models.target, n_ctx=64, exact=True)


# --- the same seed, the same answer, with or without a drafter (real GGUF models) --------------

runner = CliRunner()


def run_tokens(tiny_models, *args: str) -> list[int]:
    base = ["run", "the cat sat on", "--raw", "--target", str(tiny_models.target), "--json"]
    result = runner.invoke(app, [*base, "-n", "40", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["tokens"]


@pytest.mark.parametrize("mode", ["fixed", "combined", "model", "ngram"])
def test_sampled_answer_for_a_seed_does_not_depend_on_the_drafter(tiny_models, mode):
    sampled = ("--temp", "0.9", "--seed", "7")
    alone = run_tokens(tiny_models, *sampled, "--no-draft")
    model = ("--draft", str(tiny_models.close_drafter)) if mode != "ngram" else ()
    drafted = run_tokens(tiny_models, *sampled, *model, "--drafter", mode)
    assert drafted == alone


def test_an_exact_backend_decodes_prompts_with_the_kernels_this_machine_chose(
    tiny_models, exact_prompts
):
    # Generated tokens need invariance. A prompt keeps llama.cpp's batched kernels (and
    # their speed), cut at fixed positions; or, where the invariant ones cost no more
    # (library.invariant_prompts), takes those, as generated tokens do.
    exact = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2, exact=True)
    fast = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2, exact=False)
    try:
        prompt = exact.tokenize(CONTEXT, add_special=True)
        fast_row = np.array(fast.decode(prompt, 1))
        as_prompt = np.array(exact.decode(prompt, 1, prompt=True))
        exact.truncate(0)
        as_generated = np.array(exact.decode(prompt, len(prompt))[-1:])
        assert not np.array_equal(as_generated, fast_row)  # the kernels differ here
        expected = fast_row if exact_prompts == "aligned" else as_generated
        assert np.array_equal(as_prompt, expected)
    finally:
        exact.close()
        fast.close()


def test_models_with_few_query_heads_to_a_kv_head_keep_llama_cpps_attention(
    tiny_models, monkeypatch
):
    # Two query heads to a KV head: a one-token step would fill too few of the kernel's lanes,
    # so it is declined at every batch size and the logits are the one-row path's bits.
    monkeypatch.setattr(library, "_invariant_prompts", False)
    with_switch_on = exact_and_llama_cpps_rows(tiny_models.gqa_drafter)[0]
    assert library.use_specdec_attention(False)
    try:
        with_switch_off = exact_and_llama_cpps_rows(tiny_models.gqa_drafter)[0]
    finally:
        library.use_specdec_attention(True)
    assert np.array_equal(with_switch_on, with_switch_off)
