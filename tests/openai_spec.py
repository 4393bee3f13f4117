"""OpenAI's API for the operations `specdec serve` answers, as an OpenAPI 3.1 document:
tests/openapi/openai-subset.json, which tests/test_serve_conformance.py runs schemathesis on.

OpenAI's own openapi.yaml is neither in the repository nor reachable from CI. The `openai`
Python package is generated from it, so pydantic turns the package's request and response
types back into JSON schemas. Three kinds of edits follow, each with its reason:

- RANGES and SHAPES: bounds and shapes OpenAI's API reference states that the package's
  types lose (they are in its docstrings: "between 0 and 2", "up to 4 sequences", "token
  ids ... from -100 to 100"), for the fields specdec checks.
- REFUSED and NEUTRAL_ONLY: what specdec refuses, as docs/serve.md lists it, is left out or
  narrowed to the neutral value specdec accepts, so every request the document allows must be
  accepted (tests/test_serve_conformance.py checks that docs/serve.md names each of them).
- LENIENT: what OpenAI requires and specdec documents as optional (`model`), and null,
  which specdec takes for any optional field of a request as the field left out.

Rewrite the file from the installed package with `python tests/openai_spec.py`.
"""

from __future__ import annotations

import copy
import datetime
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import openai
from openai.types import Completion, Model
from openai.types import completion_create_params as text_params
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params
from openai.types.shared import ErrorObject
from pydantic import TypeAdapter

DOCUMENT = Path(__file__).resolve().parent / "openapi" / "openai-subset.json"
REFS = "#/components/schemas/"
CHAT_REQUEST = "ChatCompletionRequest"
TEXT_REQUEST = "CompletionRequest"
INT64 = 2**63

NULL = {"type": "null"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


# Bounds from OpenAI's API reference (most are in the package's docstrings), by schema and property.
RANGES: dict[tuple[str, str], dict] = {
    **{
        (request, name): bounds
        for request in (CHAT_REQUEST, TEXT_REQUEST)
        for name, bounds in {
            "temperature": {"minimum": 0, "maximum": 2},
            "top_p": {"minimum": 0, "maximum": 1},
            "max_tokens": {"minimum": 1},
            "seed": {"minimum": -INT64, "maximum": INT64 - 1},
            "frequency_penalty": {"minimum": -2, "maximum": 2},
            "presence_penalty": {"minimum": -2, "maximum": 2},
        }.items()
    },
    (CHAT_REQUEST, "max_completion_tokens"): {"minimum": 1},
    (CHAT_REQUEST, "top_logprobs"): {"minimum": 0, "maximum": 20},
    (TEXT_REQUEST, "logprobs"): {"minimum": 0, "maximum": 5},
    (CHAT_REQUEST, "messages"): {"minItems": 1},
    ("JSONSchema", "name"): {"pattern": "^[a-zA-Z0-9_-]{1,64}$"},
    ("FunctionDefinition", "name"): {"pattern": "^[a-zA-Z0-9_-]{1,64}$"},
}
BOUNDED = {  # the types each bound applies to
    "minimum": ("integer", "number"),
    "maximum": ("integer", "number"),
    "minItems": ("array",),
    "maxItems": ("array",),
    "pattern": ("string",),
}
MAX_STOP = 4  # "Up to 4 sequences where the API will stop generating further tokens."

# Properties specdec refuses in any form (docs/serve.md lists them), by schema.
REFUSED: dict[str, tuple[str, ...]] = {
    CHAT_REQUEST: (
        "audio",
        "function_call",
        "functions",
        "moderation",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
    ),
    "ChatCompletionAssistantMessageParam": ("audio", "function_call"),
    "ChatCompletionContentPartTextParam": ("prompt_cache_breakpoint",),
}
# Union branches specdec refuses: the deprecated `function` role, content other than text,
# custom (free-form) tools, and token ids as a prompt.
REFUSED_BRANCHES = (
    "ChatCompletionFunctionMessageParam",
    "ChatCompletionContentPartImageParam",
    "ChatCompletionContentPartInputAudioParam",
    "ChatCompletionContentPartRefusalParam",
    "File",
    "ChatCompletionCustomToolParam",
    "ChatCompletionMessageCustomToolCallParam",
    "ChatCompletionAllowedToolChoiceParam",
    "ChatCompletionNamedToolChoiceCustomParam",
)


def _neutral(*values: Any) -> dict:
    return {"anyOf": [*({"const": value} for value in values), NULL]}


# Fields specdec does not implement, accepted at their neutral value only.
_SAMPLING_NEUTRAL = {
    "n": _neutral(1),
}
NEUTRAL_ONLY: dict[str, dict[str, dict]] = {
    CHAT_REQUEST: {
        **_SAMPLING_NEUTRAL,
        "service_tier": _neutral("auto", "default"),
        "modalities": _nullable({"type": "array", "items": {"const": "text"}}),
    },
    TEXT_REQUEST: {
        **_SAMPLING_NEUTRAL,
        "best_of": _neutral(1),
        "echo": _neutral(False),
        # One prompt, as text.
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            ]
        },
    },
    "ChatCompletionAssistantMessageParam": {"refusal": NULL},
}
# Values OpenAI's API reference states that the package's types lose: logit_bias maps token
# ids to amounts from -100 to 100.
SHAPES: dict[str, dict[str, dict]] = {
    request: {
        "logit_bias": _nullable(
            {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,10}$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            }
        )
    }
    for request in (CHAT_REQUEST, TEXT_REQUEST)
}
# Required by OpenAI, optional in specdec (docs/serve.md: "`model` (optional ...)").
LENIENT: dict[str, tuple[str, ...]] = {CHAT_REQUEST: ("model",), TEXT_REQUEST: ("model",)}


def build_document(openai_version: str, generated: str) -> dict:
    """The whole document; `generated` is the date it was written (kept when checked)."""
    schemas = _component_schemas()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "OpenAI API: the operations specdec serve answers",
            "version": openai_version,
            "description": (
                f"Generated by tests/openai_spec.py on {generated} from the request and "
                f"response types of the `openai` Python package {openai_version} (itself "
                "generated from OpenAI's OpenAPI document), trimmed to what docs/serve.md "
                "says specdec accepts."
            ),
            "x-source": {"package": "openai", "version": openai_version, "date": generated},
        },
        "paths": _paths(),
        "components": {"schemas": schemas},
    }


RESPONSES = (ChatCompletion, ChatCompletionChunk, Completion, Model, ErrorObject)
REQUESTS = {
    CHAT_REQUEST: chat_params.CompletionCreateParamsBase,
    TEXT_REQUEST: text_params.CompletionCreateParamsBase,
}


def _component_schemas() -> dict:
    adapters = [
        *((name, "validation", TypeAdapter(kind)) for name, kind in REQUESTS.items()),
        *((kind.__name__, "serialization", TypeAdapter(kind)) for kind in RESPONSES),
    ]
    keys, found = TypeAdapter.json_schemas(adapters, ref_template=REFS + "{model}")
    schemas = found["$defs"]
    for (name, _), reference in keys.items():  # the requests' own names
        if name in REQUESTS:
            schemas[name] = schemas.pop(reference["$ref"].removeprefix(REFS))
    for name in REQUESTS:
        # The package types streamed and whole requests apart; one operation takes both.
        schemas[name]["properties"]["stream"] = _nullable({"type": "boolean"})
    _trim(schemas)
    schemas.update(_own_schemas())
    schemas.update(_completion_chunk(schemas))
    return _reachable(schemas, roots=[*REQUESTS, *OWN_ROOTS])


def _trim(schemas: dict) -> None:
    for name, refused in REFUSED.items():
        for field in refused:
            del schemas[name]["properties"][field]
    for name, narrowed in [*NEUTRAL_ONLY.items(), *SHAPES.items()]:
        schemas[name]["properties"].update(copy.deepcopy(narrowed))
    for name, optional in LENIENT.items():
        schemas[name]["required"] = [f for f in schemas[name]["required"] if f not in optional]
    _null_is_absent(schemas)
    _closed(schemas)
    for (name, field), bounds in RANGES.items():
        _bound(schemas[name]["properties"][field], bounds)
    for name in REQUESTS:
        _bound(schemas[name]["properties"]["stop"], {"maxItems": MAX_STOP})
        # OpenAI: "Only set this when you set `stream: true`."
        schemas[name]["dependentSchemas"] = {
            "stream_options": {"properties": {"stream": {"const": True}}, "required": ["stream"]}
        }
    # "`logprobs` must be set to `true` if this parameter is used" (top_logprobs); specdec
    # takes 0, which asks for no alternatives, as the field left out.
    schemas[CHAT_REQUEST]["if"] = {
        "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
        "required": ["top_logprobs"],
    }
    schemas[CHAT_REQUEST]["then"] = {
        "properties": {"logprobs": {"const": True}},
        "required": ["logprobs"],
    }
    for schema in _subschemas(schemas):
        if "anyOf" in schema:
            schema["anyOf"] = [s for s in schema["anyOf"] if _ref_name(s) not in REFUSED_BRANCHES]
    # OpenAI's error object has all four; the package's type leaves two optional.
    schemas["ErrorObject"]["required"] = ["message", "type", "param", "code"]


def _null_is_absent(schemas: dict) -> None:
    for name in _reachable(schemas, roots=REQUESTS):
        schema = schemas[name]
        for field, value in schema.get("properties", {}).items():
            if field not in schema.get("required", []) and not _takes_null(value):
                schema["properties"][field] = _nullable(value)


def _closed(schemas: dict) -> None:
    """OpenAI refuses an unrecognized argument ("Unrecognized request argument supplied"), and
    so does specdec, in every object of a request."""
    for name in _reachable(schemas, roots=REQUESTS):
        if "properties" in schemas[name]:
            schemas[name].setdefault("additionalProperties", False)


def _takes_null(schema: dict) -> bool:
    return schema.get("type") == "null" or any(_takes_null(s) for s in schema.get("anyOf", []))


def _bound(schema: dict, bounds: dict) -> None:
    """Bounds go on the branch of the value's type (an optional field is X or null)."""
    for branch in schema.get("anyOf", [schema]):
        branch.update({k: v for k, v in bounds.items() if branch.get("type") in BOUNDED[k]})


def _subschemas(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _subschemas(item)
    elif isinstance(value, list):
        for item in value:
            yield from _subschemas(item)


def _ref_name(schema: dict) -> str | None:
    reference = schema.get("$ref")
    return reference.removeprefix(REFS) if isinstance(reference, str) else None


def _reachable(schemas: dict, roots: Iterable[str]) -> dict:
    """Only the schemas `roots` use, in a stable order."""
    seen: set[str] = set()
    waiting = list(roots)
    while waiting:
        name = waiting.pop()
        if name not in seen:
            seen.add(name)
            waiting += [ref for s in _subschemas(schemas[name]) if (ref := _ref_name(s))]
    return {name: schemas[name] for name in sorted(seen)}


OWN_ROOTS = ("ChatCompletion", "ChatCompletionEvent", "Completion", "CompletionEvent",
             "ModelList", "Error")  # fmt: skip


def _own_schemas() -> dict:
    """What the package has no type for: the list of models, the error body, and one
    server-sent event of a streamed answer (JSON, or the closing `[DONE]`)."""
    return {
        "ModelList": {
            "type": "object",
            "properties": {
                "object": {"const": "list"},
                "data": {"type": "array", "items": {"$ref": REFS + "Model"}},
            },
            "required": ["object", "data"],
        },
        "Error": {
            "type": "object",
            "properties": {"error": {"$ref": REFS + "ErrorObject"}},
            "required": ["error"],
        },
        "ChatCompletionEvent": _event("ChatCompletionChunk"),
        "CompletionEvent": _event("CompletionChunk"),
    }


def _completion_chunk(schemas: dict) -> dict:
    """OpenAI streams completions as Completion objects whose choice has finish_reason null
    until the last; the package's type, made for whole answers, leaves null out."""
    chunk, choice = copy.deepcopy(schemas["Completion"]), copy.deepcopy(schemas["CompletionChoice"])
    chunk["title"], choice["title"] = "CompletionChunk", "CompletionChunkChoice"
    chunk["properties"]["choices"]["items"] = {"$ref": REFS + "CompletionChunkChoice"}
    choice["properties"]["finish_reason"] = _nullable(choice["properties"]["finish_reason"])
    return {"CompletionChunk": chunk, "CompletionChunkChoice": choice}


def _event(chunk: str) -> dict:
    # An error after the headers were sent comes as an event of its own.
    payload = {"anyOf": [{"$ref": REFS + chunk}, {"$ref": REFS + "Error"}]}
    return {
        "type": "object",
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {"contentMediaType": "application/json", "contentSchema": payload},
                ]
            }
        },
        "required": ["data"],
    }


def _paths() -> dict:
    return {
        "/v1/chat/completions": {
            "post": _completion("createChatCompletion", CHAT_REQUEST, "ChatCompletion")
        },
        "/v1/completions": {"post": _completion("createCompletion", TEXT_REQUEST, "Completion")},
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": {"200": _json_response("The models", "ModelList")},
            }
        },
    }


def _completion(operation: str, request: str, answer: str) -> dict:
    whole = _json_response("The answer, whole or streamed", answer)
    whole["content"]["text/event-stream"] = {"schema": {"$ref": REFS + f"{answer}Event"}}
    return {
        "operationId": operation,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REFS + request}}},
        },
        "responses": {"200": whole, "4XX": _json_response("A refused request", "Error")},
    }


def _json_response(description: str, schema: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REFS + schema}}},
    }


def document_text(document: dict) -> str:
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def main() -> None:
    today = datetime.date.today().isoformat()
    DOCUMENT.parent.mkdir(exist_ok=True)
    DOCUMENT.write_text(document_text(build_document(openai.__version__, today)))
    print(f"wrote {DOCUMENT} from openai {openai.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
