"""Fill in the middle: /v1/completions' `suffix` on a code model with FIM tokens (a tiny GGUF
with Qwen2.5-Coder's three, which llama.cpp finds by their text) becomes the prompt
llama-server's /infill lays out, and the answer is the target alone's to that prompt; a
model without them is refused with a 400 naming `suffix`. `specdec run --suffix` does the
same from the command line."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_process import ServerProcess
from tiny_gguf import FILL_IN_MIDDLE, TARGET_SEED, fill_in_middle_vocab, write_tiny_llama
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.errors import ModelFileError
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.services.prompting import fill_in_middle_tokens

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fim")
    return write_tiny_llama(
        folder / "coder.gguf", seed=TARGET_SEED, vocab=fill_in_middle_vocab(), name="tiny-coder"
    )


def test_the_prompt_lays_out_prefix_then_suffix_then_the_gap(coder):
    target = LlamaBackend(coder, n_ctx=256, n_threads=2)
    try:
        marks = target.fill_in_middle()
        assert marks is not None
        assert [target.token_text(t) for t in (marks.prefix, marks.suffix, marks.middle)] == list(
            FILL_IN_MIDDLE
        )
        bos = target.vocab_info().bos
        assert fill_in_middle_tokens(target, PREFIX, SUFFIX) == [
            bos,
            marks.prefix,
            *target.tokenize(PREFIX, add_special=False),
            marks.suffix,
            *target.tokenize(SUFFIX, add_special=False),
            marks.middle,
        ]
    finally:
        target.close()


def test_a_model_without_the_tokens_cannot_fill_in_the_middle(tiny_models):
    target = LlamaBackend(tiny_models.target, n_ctx=256, n_threads=2)
    try:
        assert target.fill_in_middle() is None
        with pytest.raises(ModelFileError, match="fill in the middle"):
            fill_in_middle_tokens(target, PREFIX, SUFFIX)
    finally:
        target.close()


def filling_prompt(model) -> list[int]:
    target = LlamaBackend(model, n_ctx=256, n_threads=1)
    try:
        return fill_in_middle_tokens(target, PREFIX, SUFFIX)
    finally:
        target.close()


def alone(model, prompt: list[int], max_tokens: int) -> str:
    target = LlamaBackend(model, n_ctx=256, n_threads=1, exact=True)
    try:
        settings = GenerationSettings(max_tokens=max_tokens, draft_max=0)
        return Generation(target, prompt, settings).run().text
    finally:
        target.close()


def test_serve_fills_in_the_middle_with_the_targets_own_answer(coder, tiny_models, tmp_path):
    server = ServerProcess(
        *("--target", str(coder), "--drafter", "ngram", "--ctx-size", "256", "--threads", "1"),
        home=tmp_path,
    )
    try:
        body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 24, "temperature": 0}
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    finally:
        assert server.stop() == 0, "\n".join(server.lines)
    prompt = filling_prompt(coder)
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    assert answer["choices"][0]["text"] == alone(coder, prompt, 24)


def test_serve_refuses_a_suffix_for_a_model_without_the_tokens(tiny_models, tmp_path):
    server = ServerProcess(
        *("--target", str(tiny_models.target), "--drafter", "none"),
        *("--ctx-size", "256", "--threads", "1"),
        home=tmp_path,
    )
    try:
        body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8}
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        plain = httpx.post(server.url + "/v1/completions", json={**body, "suffix": ""}, timeout=60)
    finally:
        assert server.stop() == 0, "\n".join(server.lines)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "suffix" and "fill in the middle" in error["message"]
    assert plain.status_code == 200  # an empty suffix is no suffix


def run_fill(model, *extra: str):
    args = ["run", PREFIX, "--suffix", SUFFIX, "--target", str(model), "-n", "24", *extra]
    return CliRunner().invoke(app, args)


def test_run_fills_in_the_middle_with_the_targets_own_answer(coder):
    result = run_fill(coder, "--drafter", "ngram", "--verify", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    prompt = filling_prompt(coder)
    assert record["stats"]["prompt_tokens"] == len(prompt)
    assert record["text"] == alone(coder, prompt, 24)
    assert record["settings"]["fill_in_middle"] is True
    assert record["verify"]["identical"] is True


@pytest.mark.parametrize(
    ("extra", "said", "code"),
    [
        ((), "not trained to fill in the middle", 1),  # the model's doing
        (("--system", "be brief"), "--system needs the chat template", 2),  # bad usage
    ],
)
def test_run_refuses_what_cannot_fill_in_the_middle(tiny_models, extra, said, code):
    result = run_fill(tiny_models.target, "--drafter", "none", *extra)
    assert result.exit_code == code
    assert said in result.output and result.stdout == ""
