"""`specdec run --prompt-cache DIR`: saved KV states, restored only into the models and
kernels that computed them, and in exact mode giving the answer a fresh prefill gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.backend import common_prefix_length, logits_for_suffix
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.services import prompt_cache
from specdec_cli.services.prompt_cache import PromptCache

CHUNK = 16  # small chunks, so short prompts hold several
SHARED = "the cat sat on the mat and then it went away the dog ran over the hill " * 3
FIRST, SECOND = SHARED + "what did the cat do", SHARED + "where did the dog run"


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(library, "PROMPT_CHUNK", CHUNK)
    monkeypatch.setattr(prompt_cache, "MIN_REUSE", CHUNK)


def backend(tiny_models, exact: bool) -> LlamaBackend:
    return LlamaBackend(tiny_models.target, n_ctx=512, n_threads=2, exact=exact)


def last_logits(target: LlamaBackend, prompt: list[int]) -> np.ndarray:
    return np.array(logits_for_suffix(target, prompt, 1, prompt=True)[0])


def restored_logits(tiny_models, tmp_path, exact: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """The second prompt's logits fresh, and after restoring the first prompt's saved state
    into another backend; and how many tokens the restored state gave."""
    fresh, saver, restorer = (backend(tiny_models, exact) for _ in range(3))
    first = saver.tokenize(FIRST, add_special=True)
    second = saver.tokenize(SECOND, add_special=True)
    cache = PromptCache(tmp_path, "key")
    last_logits(saver, first)
    assert cache.store(first, saver, None) is not None
    found = cache.best(second, restorer)
    assert found is not None and cache.restore(found[0], restorer, None)
    return last_logits(fresh, second), last_logits(restorer, second), found[1]


def test_a_restored_prefix_gives_the_logits_of_a_fresh_prefill_in_exact_mode(
    tiny_models, tmp_path, exact_prompts
):
    fresh, restored, reused = restored_logits(tiny_models, tmp_path, exact=True)
    if exact_prompts == "aligned":
        assert reused >= 3 * CHUNK and reused % CHUNK == 0
    else:  # every token it shares
        target = backend(tiny_models, True)
        first, second = (target.tokenize(text, add_special=True) for text in (FIRST, SECOND))
        target.close()
        assert reused == common_prefix_length(first, second) and reused % CHUNK != 0
    assert np.array_equal(fresh, restored)


def test_the_default_kernels_reuse_any_prefix_and_can_part_from_a_fresh_prefill(
    tiny_models, tmp_path
):
    # The control: without chunks at fixed positions the restored prefix ends anywhere,
    # and the rest of the prompt is computed in another batch than a fresh prefill's.
    fresh, restored, reused = restored_logits(tiny_models, tmp_path, exact=False)
    assert reused % CHUNK != 0
    assert not np.array_equal(fresh, restored)


def test_a_state_is_only_offered_to_its_own_key(tiny_models, tmp_path):
    saver = backend(tiny_models, True)
    first = saver.tokenize(FIRST, add_special=True)
    last_logits(saver, first)
    PromptCache(tmp_path, "one model").store(first, saver, None)
    assert PromptCache(tmp_path, "another model").best(first, saver) is None


def run_json(tiny_models, folder, prompt: str, *extra: str):
    args = ["run", prompt, "--raw", "--target", str(tiny_models.target), "-n", "12", "--json",
            "--prompt-cache", str(folder), "--threads", "2", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("drafting", [("--no-draft",), ("--drafter", "combined")])
def test_run_answers_the_same_from_a_saved_prompt(tiny_models, tmp_path, drafting):
    draft = ("--draft", str(tiny_models.close_drafter)) if "combined" in drafting else ()
    alone, _ = run_json(tiny_models, tmp_path / "fresh", SECOND, *drafting, *draft)
    run_json(tiny_models, tmp_path / "cache", FIRST, *drafting, *draft)
    again, _ = run_json(tiny_models, tmp_path / "cache", SECOND, *drafting, *draft)
    assert again["tokens"] == alone["tokens"]
    assert alone["prompt_cache"]["reused_tokens"] == 0
    assert again["prompt_cache"]["reused_tokens"] >= 3 * CHUNK


def test_a_damaged_or_foreign_file_is_skipped_with_one_warning(tiny_models, tmp_path):
    alone, _ = run_json(tiny_models, tmp_path / "fresh", SECOND, "--no-draft")
    run_json(tiny_models, tmp_path, FIRST, "--no-draft")
    [saved] = tmp_path.glob("*.state")
    data = bytearray(saved.read_bytes())
    data[-10] ^= 0xFF  # one byte of the state flipped
    saved.write_bytes(bytes(data))
    (tmp_path / "foreign.state").write_bytes(b"\x00not a prompt cache file")
    again, stderr = run_json(tiny_models, tmp_path, SECOND, "--no-draft")
    assert again["tokens"] == alone["tokens"]
    assert again["prompt_cache"]["reused_tokens"] == 0
    assert stderr.count("prompt cache:") == 1 and "skipped 2" in stderr


def test_the_folder_keeps_to_its_bound_least_recently_used_first(tiny_models, tmp_path):
    saver = backend(tiny_models, True)
    prompts = [saver.tokenize(f"{i} " + SHARED, add_special=True) for i in range(3)]
    cache = PromptCache(tmp_path, "key", max_bytes=1)  # room for the newest entry only
    for prompt in prompts:
        saver.truncate(0)
        last_logits(saver, prompt)
        newest = cache.store(prompt, saver, None)
    assert list(tmp_path.glob("*.state")) == [newest]
