"""Structured outputs: what an answer must look like (a GBNF grammar, a JSON schema, or any
JSON object), checked when it is asked for, before any model is loaded. The backend turns
one into a grammar the target's choices are masked by (see decoding/constraint.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from .errors import SpecdecError

# What llama.cpp's JSON-schema converter (the one llama-cpp-python ships) turns into grammar
# rules. Any other keyword that constrains a value would be ignored by it, so a schema that
# uses one is refused instead: the answer would parse and yet not match the schema.
SCHEMA_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "enum", "const", "oneOf", "anyOf", "allOf", "$ref", "$defs",
        "definitions", "pattern", "format", "minLength", "maxLength",
    }
)  # fmt: skip
# Keywords that describe and constrain nothing.
SCHEMA_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
     "readOnly", "writeOnly"}
)  # fmt: skip
# String formats the converter knows (others would be any string).
SCHEMA_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3",
                            "uuid4", "uuid5"})  # fmt: skip
SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


class StructureError(SpecdecError):
    """A grammar or schema that cannot be used (malformed, or asks for what is unsupported)."""


class StructureKind(str, Enum):
    GRAMMAR = "grammar"  # llama.cpp's GBNF, root rule `root`
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"  # any JSON object

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Structure:
    """What the answer must be: `text` is the GBNF grammar or the schema's JSON ('' for any
    JSON object); a schema's JSON may have to come between `before` and `after` (a tool
    call's tags)."""

    kind: StructureKind
    text: str = ""
    before: str = ""
    after: str = ""

    @classmethod
    def grammar(cls, text: str) -> Structure:
        if not text.strip():
            raise StructureError("the grammar is empty.", "Give GBNF rules with a root rule.")
        if "root" not in text or "::=" not in text:
            raise StructureError(
                "the grammar has no `root ::= ...` rule.", "GBNF starts from the rule `root`."
            )
        return cls(StructureKind.GRAMMAR, text)

    @classmethod
    def json_schema(cls, schema: object, before: str = "", after: str = "") -> Structure:
        """`schema`: the parsed schema (a dict), checked for what the converter supports."""
        if not isinstance(schema, dict):
            raise StructureError("a JSON schema must be a JSON object.", "See json-schema.org.")
        check_schema(schema, "schema")
        text = json.dumps(schema)  # in its own order: the answer's keys come in it
        return cls(StructureKind.JSON_SCHEMA, text, before, after)

    @classmethod
    def json_object(cls) -> Structure:
        return cls(StructureKind.JSON_OBJECT)

    def record(self) -> dict:
        return {"kind": self.kind.value, "text": self.text}


def parse_json_schema(text: str, where: str) -> Structure:
    try:
        schema = json.loads(text)
    except ValueError as error:
        raise StructureError(f"{where} is not JSON ({error}).", "Give a JSON schema.") from None
    return Structure.json_schema(schema)


def check_schema(schema: object, path: str) -> None:
    """Raise StructureError naming the first keyword (with its place) that would be ignored."""
    if isinstance(schema, bool):
        return  # true: anything; false: nothing (both are schemas)
    if not isinstance(schema, dict):
        raise StructureError(f"{path} is not a schema (an object or true/false).")
    for keyword, value in schema.items():
        if keyword in SCHEMA_ANNOTATIONS:
            continue
        if keyword not in SCHEMA_KEYWORDS:
            raise StructureError(
                f"{path}: the JSON-schema keyword '{keyword}' is not supported.",
                f"Supported: {', '.join(sorted(SCHEMA_KEYWORDS))}.",
            )
        _check_keyword(keyword, value, f"{path}.{keyword}")


def _check_keyword(keyword: str, value: object, path: str) -> None:
    if keyword == "type":
        types = value if isinstance(value, list) else [value]
        unknown = [t for t in types if t not in SCHEMA_TYPES]
        if unknown:
            raise StructureError(f"{path}: unknown type {unknown[0]!r}.")
    elif keyword == "format" and value not in SCHEMA_FORMATS:
        raise StructureError(
            f"{path}: the string format {value!r} is not supported.",
            f"Supported: {', '.join(sorted(SCHEMA_FORMATS))}, or a pattern.",
        )
    elif keyword in ("properties", "$defs", "definitions"):
        if not isinstance(value, dict):
            raise StructureError(f"{path} must be an object of schemas.")
        for name, sub in value.items():
            check_schema(sub, f"{path}.{name}")
    elif keyword in ("oneOf", "anyOf", "allOf", "prefixItems"):
        if not isinstance(value, list):
            raise StructureError(f"{path} must be a list of schemas.")
        for i, sub in enumerate(value):
            check_schema(sub, f"{path}[{i}]")
    elif keyword in ("items", "additionalProperties"):
        if isinstance(value, list):  # items as a tuple (the older spelling of prefixItems)
            for i, sub in enumerate(value):
                check_schema(sub, f"{path}[{i}]")
        else:
            check_schema(value, path)
