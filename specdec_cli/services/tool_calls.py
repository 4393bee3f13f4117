"""Tool calls in the Hermes format that Qwen2.5's chat template teaches its models:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The tools are rendered by the model's own chat template (it takes `tools`); what the model
writes is split here into content and OpenAI's `tool_calls`; a call that must be made
(`tool_choice` "required" or a named function) is a JSON schema between the two tags, so
the grammar makes the model write one that parses and matches the function's parameters.
Pure: no HTTP and no models. Shared by `specdec serve` (OpenAI's tools) and `specdec run
--tools FILE`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..decoding.engine import partial_match
from ..structured import Structure, StructureError, check_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


def template_speaks_tools(template: str | None) -> bool:
    """Whether a chat template renders tools and teaches the Hermes tags (Qwen2.5's does;
    Gemma 3's has no tools at all)."""
    return template is not None and "tools" in template and OPEN in template


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict  # a JSON schema (an object's, usually)

    @classmethod
    def of(cls, name: str, description: str | None, parameters: dict | None) -> Function:
        """A function as a request gives it: without parameters, it takes an empty object."""
        return cls(name, description, parameters or {"type": "object", "properties": {}})

    def template_entry(self) -> dict:
        """As llama.cpp hands a tool to chat templates: templates such as Qwen2.5's print it
        whole (`tool | tojson`), so its key order and empty description are prompt text."""
        function = {
            "name": self.name,
            "description": self.description or "",
            "parameters": self.parameters,
        }
        return {"type": "function", "function": function}

    def call_schema(self) -> dict:
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": self.parameters},
            "required": ["name", "arguments"],
        }


def read_tools(text: str, where: str) -> list[Function]:
    """A tools file for `run --tools`: OpenAI's `tools` list as JSON, each function's
    parameters a schema the grammar supports (the same check as serve's)."""
    try:
        entries = json.loads(text)
    except ValueError as error:
        raise StructureError(f"{where} is not JSON ({error}).", _TOOLS_SHAPE) from None
    if not isinstance(entries, list) or not entries:
        raise StructureError(f"{where} must be a non-empty JSON list of tools.", _TOOLS_SHAPE)
    functions = [_function(entry, f"{where}: tool {i}") for i, entry in enumerate(entries)]
    names = [f.name for f in functions]
    if len(set(names)) < len(names):
        raise StructureError(f"{where}: two tools have the same name.", "Name each tool once.")
    return functions


_TOOLS_SHAPE = (
    'Give a list such as [{"type": "function", "function": {"name": ..., "parameters": {...}}}].'
)


def _function(entry: object, where: str) -> Function:
    function = entry.get("function") if isinstance(entry, dict) else None
    is_function = isinstance(entry, dict) and entry.get("type") == "function"
    if not is_function or not isinstance(function, dict):
        raise StructureError(f"{where} is not a function tool.", _TOOLS_SHAPE)
    name, description = function.get("name"), function.get("description")
    if not isinstance(name, str) or not name:
        raise StructureError(f"{where} has no name.", _TOOLS_SHAPE)
    if description is not None and not isinstance(description, str):
        raise StructureError(f"{where}: the description must be text.", _TOOLS_SHAPE)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise StructureError(f"{where} ({name}): parameters must be a JSON schema object.")
    if parameters is not None:  # the keywords the grammar cannot honour, named with their place
        check_schema(parameters, f"{where} ({name}) parameters")
    return Function.of(name, description, parameters)


def chosen_functions(functions: Sequence[Function], choice: str) -> list[Function]:
    """The functions one of which must be called under `choice` ("required": any, a name:
    that one; "auto" and "none": none forced)."""
    if choice == "required":
        return list(functions)
    if choice in ("auto", "none"):
        return []
    return [f for f in functions if f.name == choice]


def forced_call(functions: Sequence[Function]) -> Structure:
    """One call of one of `functions`, between the tags: for tool_choice "required" (all the
    tools) or a named function (that one)."""
    schemas = [f.call_schema() for f in functions]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return Structure.json_schema(schema, before=OPEN + "\n", after="\n" + CLOSE)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def split_calls(text: str, known: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """The text outside the tags, and the calls inside them. A block that is not a call of
    a known function (bad JSON, another name) stays in the text, as the model wrote it.
    Without tags, an answer that is nothing but one call's JSON (bare, or in a ```json
    fence, as Qwen2.5-Coder 1.5B writes them unforced) is that call."""
    bare = _bare_call(text, known)
    if bare is not None:
        return "", [bare]
    calls: list[ToolCall] = []
    kept: list[str] = []
    at = 0
    for match in _CALL.finditer(text):
        call = _parse_call(match.group(1), known)
        if call is None:
            continue
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(call)
    kept.append(text[at:])
    return "".join(kept).strip() if calls else text, calls


def _bare_call(text: str, known: Sequence[str]) -> ToolCall | None:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    body = fenced.group(1) if fenced else body
    return _parse_call(body, known) if body.startswith("{") else None


def could_be_bare_call(text: str) -> bool:
    """Whether an answer that starts so may still turn out to be a bare call."""
    start = text.lstrip()
    return start.startswith(("{", "```")) or "```".startswith(start)


def _parse_call(body: str, known: Sequence[str]) -> ToolCall | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("name") not in known:
        return None
    arguments = parsed.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(parsed["name"], text, f"call_{uuid.uuid4().hex[:24]}")


class HeldText:
    """Streams content while holding back what may be the start of a tool call: text from
    the first OPEN on waits for the end of the answer, and so does an answer for as long
    as it may be a bare call."""

    def __init__(self) -> None:
        self.text = ""
        self._released = 0
        self._in_call = False

    def feed(self, piece: str) -> str:
        """The content that is safe to send now."""
        self.text += piece
        if self._in_call or (self._released == 0 and could_be_bare_call(self.text)):
            return ""
        found = self.text.find(OPEN, self._released)
        if found >= 0:
            self._in_call = True
            return self._release(found)
        return self._release(len(self.text) - partial_match(self.text, OPEN))

    def _release(self, end: int) -> str:
        out, self._released = self.text[self._released : end], max(end, self._released)
        return out

    @property
    def held(self) -> str:
        return self.text[self._released :]


def arguments_object(arguments: str, where: str) -> dict:
    """An earlier call's arguments (JSON text) as the object chat templates render; raises
    ValueError saying `where` when they are not a JSON object."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise ValueError(f"{where} is not JSON.") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where} must be a JSON object.")
    return parsed
