"""What exact mode keeps of a cached prompt on this machine (library.invariant_prompts):
with the invariant prompt kernels every token the next prompt shares, else the whole
PROMPT_CHUNKs of the first prompt. For tests that see a later turn's cached tokens."""

from __future__ import annotations

from specdec_cli.llama import library


def assert_exact_reuse(cached: int, first_prompt: int, second_prompt: int) -> None:
    """A second prompt that starts with the first prompt (and its answer) kept `cached`."""
    if library.invariant_prompts():  # all of the first prompt, and maybe of its answer
        assert first_prompt <= cached < second_prompt, (cached, first_prompt, second_prompt)
    else:
        chunk = library.PROMPT_CHUNK
        assert cached == first_prompt // chunk * chunk, (cached, first_prompt)
