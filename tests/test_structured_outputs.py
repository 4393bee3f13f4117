"""Structured outputs end to end on tiny GGUF models, through llama.cpp's grammar engine:
`specdec run --json-schema / --grammar` answers JSON that matches (or text the grammar
allows), speculative decoding gives the target alone's answer under the same constraint,
and what cannot be honoured is refused with one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.serve.serve_protocol import ApiError, ChatCompletionRequest, CompletionRequest
from specdec_cli.structured import Structure, StructureError, StructureKind

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "size": {"enum": ["small", "large"]},
        "word": {"type": "string", "maxLength": 6},
        "count": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["ok", "size", "word", "count", "items"],
}
# Answers of three words from a small set, separated by single spaces.
GRAMMAR = 'root ::= word " " word " " word\nword ::= "cat" | "sat" | "mat" | "on" | "the"\n'
PROMPTS = ["the cat sat on", "one two three four"]


def run_json(target, prompt: str, *extra: str) -> dict:
    args = ["run", prompt, "--raw", "--target", str(target), "--json", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def matches_schema(answer: dict) -> bool:
    return (
        list(answer) == list(SCHEMA["properties"])  # the schema's order
        and isinstance(answer["ok"], bool)
        and answer["size"] in ("small", "large")
        and isinstance(answer["word"], str)
        and len(answer["word"]) <= 6
        and isinstance(answer["count"], int)
        and len(answer["items"]) <= 2
        and all(isinstance(i, str) and len(i) <= 4 for i in answer["items"])
    )


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


@pytest.fixture(scope="module")
def grammar_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grammar") / "three.gbnf"
    path.write_text(GRAMMAR)
    return path


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_schema_answer_matches_and_drafting_leaves_it_as_the_target_alones(
    tiny_models, schema_file, prompt
):
    constrained = ("--json-schema", str(schema_file), "-n", "96")
    alone = run_json(tiny_models.target, prompt, "--no-draft", *constrained)
    assert alone["finish_reason"] == "stop"
    assert matches_schema(json.loads(alone["text"])), alone["text"]
    free = run_json(tiny_models.target, prompt, "--no-draft", "-n", "24")
    assert not free["text"].lstrip().startswith("{")  # the control: unconstrained, no JSON
    drafter = str(tiny_models.close_drafter)
    for mode in ("fixed", "combined"):
        drafted = run_json(tiny_models.target, prompt, "--draft", drafter, "--drafter", mode,
                           *constrained)  # fmt: skip
        assert drafted["tokens"] == alone["tokens"], mode
    assert alone["settings"]["structure"] == "json_schema"


@pytest.mark.parametrize("seed", ["4", "5"])
def test_seeded_sampling_under_a_schema_is_the_target_alones_whoever_drafts(
    tiny_models, schema_file, seed
):
    sampled = ("--json-schema", str(schema_file), "-n", "96", "--temp", "1.0", "--seed", seed)
    alone = run_json(tiny_models.soft_target, PROMPTS[0], "--no-draft", *sampled)
    assert matches_schema(json.loads(alone["text"])), alone["text"]
    drafter = str(tiny_models.soft_drafter)
    drafted = run_json(tiny_models.soft_target, PROMPTS[0], "--draft", drafter, "--drafter",
                       "fixed", *sampled)  # fmt: skip
    assert drafted["tokens"] == alone["tokens"]


def test_a_grammar_answer_follows_it(tiny_models, grammar_file):
    drafter = str(tiny_models.close_drafter)
    for prompt in PROMPTS:
        alone = run_json(tiny_models.target, prompt, "--no-draft", "--grammar", str(grammar_file))
        words = alone["text"].split(" ")
        assert len(words) == 3 and set(words) <= {"cat", "sat", "mat", "on", "the"}, alone["text"]
        assert alone["finish_reason"] == "stop"
        drafted = run_json(tiny_models.target, prompt, "--draft", drafter, "--drafter", "fixed",
                           "--grammar", str(grammar_file))  # fmt: skip
        assert drafted["tokens"] == alone["tokens"]


def refused(target, *extra: str, code: int = 1) -> str:
    """What `run` says when it refuses (exit 1: bad input; 2: options that contradict)."""
    result = CliRunner().invoke(app, ["run", "hi", "--raw", "--target", str(target), *extra])
    assert result.exit_code == code, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output


def test_what_cannot_be_honoured_is_refused_in_one_line(tiny_models, tmp_path, schema_file):
    minimum = tmp_path / "minimum.json"
    minimum.write_text(json.dumps({"type": "object", "properties": {"n": {"minimum": 3}}}))
    ignored = refused(tiny_models.target, "--json-schema", str(minimum))
    assert "'minimum' is not supported" in ignored
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "is not JSON" in refused(tiny_models.target, "--json-schema", str(broken))
    garbage = tmp_path / "garbage.gbnf"
    garbage.write_text("root ::= (\n")
    unparsed = refused(tiny_models.target, "--no-draft", "--grammar", str(garbage))
    assert "could not parse the grammar" in unparsed
    both = refused(
        tiny_models.target, "--json-schema", str(schema_file), "--grammar", str(garbage), code=2
    )
    assert "Give one" in both
    assert "cannot read" in refused(tiny_models.target, "--grammar", str(tmp_path / "none.gbnf"))


# ---- the schema check and the request fields (no model) ---------------------------------------


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "integer", "minimum": 0}, "minimum"),
        ({"properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems"),
        ({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}, "not"),
        ({"type": "string", "format": "email"}, "email"),
        ({"$defs": {"x": {"multipleOf": 2}}}, "multipleOf"),
        ({"type": "decimal"}, "decimal"),
    ],
)
def test_a_schema_keyword_the_grammar_would_ignore_is_named(schema, named):
    with pytest.raises(StructureError, match=named):
        Structure.json_schema(schema)


def test_descriptions_and_supported_keywords_pass():
    schema = {**SCHEMA, "title": "thing", "description": "a thing", "$schema": "x"}
    assert Structure.json_schema(schema).kind == StructureKind.JSON_SCHEMA


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_the_request_fields_become_one_structure():
    assert chat().structure() is None
    assert chat(response_format={"type": "text"}).structure() is None
    assert chat(response_format={"type": "json_object"}).structure() == Structure.json_object()
    wrapped = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    assert chat(response_format=wrapped).structure() == Structure.json_schema(SCHEMA)
    assert chat(json_schema=SCHEMA).structure() == Structure.json_schema(SCHEMA)
    assert chat(grammar=GRAMMAR).structure() == Structure.grammar(GRAMMAR)
    raw = CompletionRequest.model_validate({"prompt": "x", "grammar": GRAMMAR})
    assert raw.structure() == Structure.grammar(GRAMMAR)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "number", "maximum": 1}}}},
            "response_format.json_schema.schema",
        ),
        ({"json_schema": {"type": "string", "format": "email"}}, "json_schema"),
        ({"grammar": "  "}, "grammar"),
        ({"grammar": GRAMMAR, "json_schema": SCHEMA}, None),
        ({"response_format": {"type": "json_object"}, "grammar": GRAMMAR}, None),
    ],
)  # fmt: skip
def test_requests_that_cannot_be_honoured_are_400s_naming_the_field(fields, param):
    with pytest.raises(ApiError) as raised:
        chat(**fields).check_supported()
    assert raised.value.status == 400 and raised.value.param == param


def test_an_answer_cut_by_max_tokens_ends_with_length_and_valid_so_far(tiny_models, schema_file):
    whole = run_json(tiny_models.target, PROMPTS[0], "--no-draft", "--json-schema",
                     str(schema_file), "-n", "96")  # fmt: skip
    cut = run_json(tiny_models.target, PROMPTS[0], "--no-draft", "--json-schema",
                   str(schema_file), "-n", "6")  # fmt: skip
    assert cut["finish_reason"] == "length" and len(cut["tokens"]) == 6
    assert whole["text"].startswith(cut["text"]) and whole["tokens"][:6] == cut["tokens"]


# ---- bench: structured workloads -------------------------------------------------------------

STRUCTURED_PROMPTS = {
    "version": 1,
    "prompts": [
        {"id": "card", "category": "extraction", "max_tokens": 96, "text": "the cat sat on",
         "json_schema": SCHEMA},
        {"id": "call", "category": "tool call", "max_tokens": 200, "text": "one two three",
         "tools": [{"type": "function", "function": {"name": "weather", "parameters": {
             "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
             "required": ["city"]}}}]},
    ],
}  # fmt: skip


def test_bench_measures_structured_prompts_valid_and_identical(tiny_models, tmp_path):
    prompts = tmp_path / "structured.json"
    prompts.write_text("\n".join(json.dumps(p) for p in STRUCTURED_PROMPTS["prompts"]))
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_models.target), "--draft",
            str(tiny_models.close_drafter), "--prompts", str(prompts), "--ctx-size", "1024",
            "--warmup", "4", "--drafter", "fixed", "--repeats", "1",
            "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"SPECDEC_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    runs = len(report["runs"])  # two prompts, each side once
    assert runs >= 4 and report["summary"]["structured"] == {"answers": runs, "valid": runs}
    assert f"structured answers: {runs} of {runs}" in result.output
    assert all(row["output"]["identical"] for row in report["prompts"])
    call = next(r for r in report["runs"] if r["prompt"] == "call")
    assert call["text"].startswith("<tool_call>")


def test_a_broken_answer_is_not_valid():
    from specdec_cli.bench.bench_prompts import BenchPrompt

    card = BenchPrompt("card", "x", "t", json_schema=SCHEMA)
    good = {"ok": True, "size": "small", "word": "cat", "count": 3, "items": ["a"]}
    assert card.valid(json.dumps(good)) is True
    assert card.valid(json.dumps({**good, "size": "huge"})) is False
    assert card.valid(json.dumps({**good, "items": ["a", "b", "c"]})) is False
    assert card.valid(json.dumps({**good, "count": 2.5})) is False
    assert card.valid("{") is False
    free = BenchPrompt("free", "x", "t")
    assert free.valid("anything") is None


@pytest.mark.parametrize(
    ("value", "schema", "ok"),
    [
        (True, {"type": "integer"}, False),
        (3, {"type": "number"}, True),
        (3.0, {"type": "integer"}, True),
        ("2024-03-02", {"type": "string", "format": "date"}, True),
        ("March 2nd", {"type": "string", "format": "date"}, False),
        ([1, "a"], {"prefixItems": [{"type": "integer"}, {"type": "string"}]}, True),
        ({"a": 1}, {"type": "object", "additionalProperties": False}, False),
        ({"x": {"y": 1}}, {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {
            "properties": {"y": {"$ref": "#/$defs/n"}}}}}, True),
        (2, {"anyOf": [{"type": "string"}, {"const": 2}]}, True),
        ("ab", {"pattern": "^a+$"}, False),
    ],
)  # fmt: skip
def test_the_schema_check_of_answers(value, schema, ok):
    from specdec_cli.structured import schema_errors

    assert (not schema_errors(value, schema)) is ok
