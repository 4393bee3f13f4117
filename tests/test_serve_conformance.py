"""`specdec serve` against OpenAI's API document: schemathesis sends what the document
allows and what it forbids to a real server on the tiny GGUF pair, and checks every answer
(no 5xx, bodies and streamed events as documented, invalid requests refused, valid ones
accepted). The document (tests/openapi/openai-subset.json) is generated from the `openai`
package by tests/openai_spec.py, with specdec's documented refusals left out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openai_spec import DOCUMENT, NEUTRAL_ONLY, REFUSED, build_document, document_text
from serve_process import ServerProcess
from tiny_gguf import TARGET_SEED, TOOLS_TEMPLATE, write_tiny_llama

CONTEXT = 256  # tokens: answers stay short, so a run takes seconds
EXAMPLES = 100  # per operation, valid and invalid requests together; derandomized

schema = schemathesis.openapi.from_path(DOCUMENT)

# Valid requests that docs/serve.md says are refused: (param, code) patterns of their 400s.
DOCUMENTED_REFUSALS = {
    (".*", "context_length_exceeded"): "a prompt the context cannot hold",
    ("max_(completion_)?tokens", "invalid_value"): "a limit the context could never hold",
    ("tool_choice", ".*"): "a function that is not among the tools, or none to require",
    ("tools", ".*"): "two tools with the same name",
    (r"response_format\.json_schema\.schema|tools\.\d+\.function\.parameters", ".*"):
        "a JSON-schema keyword the grammar would ignore",
    (r"messages\.\d+\.tool_calls\.\d+\.function\.arguments", ".*"):
        "an earlier call's arguments that are not a JSON object",
    ("suffix", ".*"): "a suffix for a model without fill-in-the-middle tokens",
    ("logit_bias", ".*"): "a token id past the model's vocabulary",
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("conformance")
    # The tiny target with a template that renders tools: requests with tools are valid.
    target = write_tiny_llama(
        folder / "target.gguf", seed=TARGET_SEED, chat_template=TOOLS_TEMPLATE, name="target"
    )
    process = ServerProcess(
        *("--target", str(target), "--draft", str(tiny_models.close_drafter)),
        *("--ctx-size", str(CONTEXT), "--threads", "1"),
        home=folder / "home",
    )
    yield process
    assert process.stop() == 0, "\n".join(process.lines)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_server_answers_as_openai_documents(case, server):
    response = case.call(base_url=server.url)
    excluded = [schemathesis.checks.positive_data_acceptance] if _documented(response) else []
    case.validate_response(response, excluded_checks=excluded)


def _documented(response) -> bool:
    if response.status_code != 400:
        return False
    error = response.json()["error"]
    param, code = error["param"] or "", error["code"] or ""
    return any(
        re.fullmatch(param_pattern, param) and re.fullmatch(code_pattern, code)
        for param_pattern, code_pattern in DOCUMENTED_REFUSALS
    )


# ---- the document stays what the installed openai package says ------------------------------

SERVE_DOCS = Path(__file__).resolve().parents[1] / "docs" / "serve.md"


def test_the_document_is_generated_from_the_installed_openai_package():
    committed = json.loads(DOCUMENT.read_text())
    source = committed["info"]["x-source"]
    assert source["version"] == openai.__version__, (  # pyproject pins it to the document's
        f"the document is openai {source['version']}'s, openai {openai.__version__} is "
        "installed: pin that version in pyproject.toml and run python tests/openai_spec.py"
    )
    expected = document_text(build_document(openai.__version__, source["date"]))
    assert DOCUMENT.read_text() == expected, "run: python tests/openai_spec.py"


@pytest.mark.parametrize(
    "field",
    sorted(
        {f for fields in REFUSED.values() for f in fields}
        | {f for n in NEUTRAL_ONLY.values() for f in n}
    ),
)
def test_each_field_left_out_of_the_document_is_listed_in_docs(field):
    assert f"`{field}`" in SERVE_DOCS.read_text()
