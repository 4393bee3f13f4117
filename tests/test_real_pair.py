"""The real Qwen2.5-Coder pair (../shared/models/README.md), fetched and cached on first use.

Greedy speculative decoding must give the target's own output. On CPU llama.cpp's batched
and one-token kernels round differently, so the texts may part where the target's two best
tokens nearly tie; anywhere else a difference is a bug.
"""

from __future__ import annotations

import pytest

from specdec_cli.comparison import compare_outputs
from specdec_cli.drafters import ModelDrafter
from specdec_cli.engine import Finished, Generation, GenerationSettings
from specdec_cli.fetch import resolve_model
from specdec_cli.session import HardwareOptions, load_pair, prompt_tokens

pytestmark = pytest.mark.slow

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Give a JSON object with the fields name, age and city for a fictional person.",
    "Explain in three sentences why the sky is blue.",
)
TOKENS = 64
NEAR_TIE = 1.0  # logits


@pytest.fixture(scope="module")
def pair(shared_model_cache):
    """The real pair from the user's cache (downloaded there on first use)."""
    target = resolve_model("large").path
    drafter = resolve_model("small").path
    models = load_pair(target, drafter, HardwareOptions(ctx_size=1024))
    yield models
    models.close()


def generate(pair, prompt: list[int], drafter) -> Finished:
    pair.reset()
    settings = GenerationSettings(max_tokens=TOKENS, draft_max=4)
    generation = Generation(pair.target, prompt, settings, drafter)
    return next(e for e in generation.events() if isinstance(e, Finished))


@pytest.mark.parametrize("text", PROMPTS)
def test_speculative_output_is_the_targets_own(pair, text):
    prompt = prompt_tokens(pair.target, text, system=None, raw=False)
    speculative = generate(pair, prompt, ModelDrafter(pair.drafter))
    plain = generate(pair, prompt, None)
    assert speculative.stats.accepted > 0
    comparison = compare_outputs(pair.target, prompt, speculative.tokens, plain.tokens)
    if not comparison.identical:
        assert comparison.top2_margin < NEAR_TIE, (
            f"outputs part at token {comparison.first_difference} where the target's top-2 "
            f"margin is {comparison.top2_margin:.3f}: not a rounding-level tie\n"
            f"speculative: {speculative.text!r}\nplain: {plain.text!r}"
        )
