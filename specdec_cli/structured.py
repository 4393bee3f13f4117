"""Structured outputs: what an answer must look like (a GBNF grammar, a JSON schema, or any
JSON object), checked when it is asked for, before any model is loaded. The backend turns
one into a grammar the target's choices are masked by (see decoding/constraint.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

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


def read_structure_file(path: Path, option: str) -> str:
    """The text of a file holding a schema, a grammar or tools (`option`: how it was given,
    --json-schema, /grammar ..., for the error)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise StructureError(f"{option}: cannot read {path} ({reason}).") from None


def structure_from_file(kind: StructureKind, path: Path, option: str) -> Structure:
    """A JSON schema or a GBNF grammar from the file at `path`, read and checked."""
    text = read_structure_file(path, option)
    if kind == StructureKind.JSON_SCHEMA:
        return parse_json_schema(text, f"{option} {path}")
    return Structure.grammar(text)


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


_FORMATS = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "time": r"\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?",
    "date-time": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?",
}
_JSON_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
}  # fmt: skip


def schema_errors(value: object, schema: object, root: object = None, path: str = "$") -> list[str]:
    """Where `value` breaks `schema`, for the keywords check_schema accepts (the bench's
    validity check: an answer that parses and matches). Empty: it matches."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if schema is False or not isinstance(schema, dict):
        return [f"{path}: nothing matches this schema"]
    if "$ref" in schema:
        return schema_errors(value, _resolve(schema["$ref"], root), root, path)
    errors: list[str] = []
    if "type" in schema and not _has_type(value, schema["type"]):
        return [f"{path}: not of type {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not one of {schema['enum']}")
    for keyword, need in (("anyOf", 1), ("oneOf", 1)):
        if keyword in schema:
            fits = sum(not schema_errors(value, s, root, path) for s in schema[keyword])
            if fits < need or (keyword == "oneOf" and fits > 1):
                errors.append(f"{path}: matches {fits} of {keyword}")
    for sub in schema.get("allOf", []):
        errors += schema_errors(value, sub, root, path)
    if isinstance(value, dict):
        errors += _object_errors(value, schema, root, path)
    if isinstance(value, list):
        errors += _array_errors(value, schema, root, path)
    if isinstance(value, str):
        errors += _string_errors(value, schema, path)
    return errors


def _has_type(value: object, wanted: object) -> bool:
    names = wanted if isinstance(wanted, list) else [wanted]
    for name in names:
        if name in ("number", "integer"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if name == "number" or float(value).is_integer():
                return True
        elif isinstance(value, _JSON_TYPES.get(str(name), ())) and not (
            name != "boolean" and isinstance(value, bool)
        ):
            return True
    return False


def _resolve(ref: str, root: object) -> object:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
        node = node.get(part, False) if isinstance(node, dict) else False
    return node


def _object_errors(value: dict, schema: dict, root: object, path: str) -> list[str]:
    errors = [
        f"{path}: '{name}' is missing" for name in schema.get("required", []) if name not in value
    ]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            errors += schema_errors(item, properties[name], root, f"{path}.{name}")
        else:
            errors += schema_errors(item, extra, root, f"{path}.{name}")
    return errors


def _array_errors(value: list, schema: dict, root: object, path: str) -> list[str]:
    errors = []
    if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
        errors.append(f"{path}: {len(value)} items")
    items = schema.get("items", True)
    prefix = schema.get("prefixItems", items if isinstance(items, list) else [])
    rest = True if isinstance(items, list) else items  # the older tuple form: any after it
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else rest
        errors += schema_errors(item, sub, root, f"{path}[{i}]")
    return errors


def _string_errors(value: str, schema: dict, path: str) -> list[str]:
    errors = []
    if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
        errors.append(f"{path}: {len(value)} characters")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match {schema['pattern']}")
    form = schema.get("format", "")
    if form in _FORMATS and not re.fullmatch(_FORMATS[form], value):
        errors.append(f"{path}: not a {form}")
    if form.startswith("uuid") and not re.fullmatch(
        r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", value
    ):
        errors.append(f"{path}: not a uuid")
    return errors
