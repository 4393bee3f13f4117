"""Drafting by text with real models of other vocabularies (pulled from PyPI: models.yaml):
SmolLM2-135M (byte-level BPE, 49,152 tokens) drafting for Qwen2.5-Coder-1.5B (byte-level
BPE, 151,936 tokens) and for Gemma 3 270M (SentencePiece, 262,144 tokens). In exact mode
the answer must be the target alone's, byte for byte, whatever the drafter proposes."""

from __future__ import annotations

import json

import pytest
from test_real_pair import PROMPTS
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.models.resolve import resolve_model

pytestmark = pytest.mark.slow

TOKENS = 64


@pytest.fixture(scope="module")
def models(shared_model_cache):
    """The files, from the user's cache (downloaded there on first use)."""
    return {name: resolve_model(name).path for name in ("large", "tiny", "gemma3-270m")}


def run_json(models, target: str, text: str, *args: str) -> dict:
    base = ["run", text, "--target", str(models[target]), "-n", str(TOKENS), "--json"]
    result = CliRunner().invoke(app, [*base, "--ctx-size", "2048", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def by_text(models, *args: str) -> tuple[str, ...]:
    return ("--draft", str(models["tiny"]), *args)


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.id for p in PROMPTS])
def test_smollm2_drafting_for_qwen_gives_the_target_alones_answer(models, prompt):
    alone = run_json(models, "large", prompt.text, "--no-draft")
    for mode in ("fixed", "combined"):
        drafted = run_json(models, "large", prompt.text, *by_text(models, "--drafter", mode))
        assert drafted["text"] == alone["text"], f"{mode} parted from the target alone"
        assert drafted["tokens"] == alone["tokens"]
        if mode == "fixed":  # every round drafts by text, and the target keeps some of it
            assert drafted["stats"]["draft_sources"].get("text", 0) > 0
            assert drafted["stats"]["accepted"] > 0


def test_seeded_sampling_with_drafts_by_text_is_the_target_alones(models):
    text = PROMPTS[0].text
    sampled = ("--temp", "0.7", "--seed", "11")
    alone = run_json(models, "large", text, "--no-draft", *sampled)
    drafted = run_json(models, "large", text, *by_text(models, "--drafter", "fixed"), *sampled)
    assert drafted["text"] == alone["text"]
    assert drafted["stats"]["accepted"] > 0


def test_smollm2_drafting_for_gemma_across_sentencepiece(models):
    text = "Counting from one: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    alone = run_json(models, "gemma3-270m", text, "--raw", "--no-draft")
    drafted = run_json(models, "gemma3-270m", text, "--raw", *by_text(models, "--drafter", "fixed"))
    assert drafted["text"] == alone["text"]
    assert drafted["tokens"] == alone["tokens"]
    assert drafted["stats"]["accepted"] > 0  # the numbers go on the same in both vocabularies
