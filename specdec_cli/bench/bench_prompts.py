"""Bench prompt files: the built-in suite, YAML or JSONL of the user's, sessions, selection."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..decoding.backend import Backend, encode_chat
from ..errors import BadUsageError
from ..services.prompting import prompt_tokens
from ..services.tool_calls import Function, forced_call, split_calls
from ..structured import Structure, StructureError, schema_errors

DEFAULT_MAX_TOKENS = 128
BUILTIN_SUITE = Path(__file__).parent / "prompts" / "suite.yaml"
# Built-in prompt files by name (--prompts sessions): workloads that repeat across requests.
BUILTIN_PROMPTS = {
    "suite": BUILTIN_SUITE,
    "sessions": BUILTIN_SUITE.with_name("sessions.yaml"),
    "structured": BUILTIN_SUITE.with_name("structured.yaml"),  # JSON schemas, tool calls
}


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str | None = None  # a user message (through the chat template unless --raw)
    # {role, content}; an assistant's may carry tool_calls, a tool's a tool_call_id
    messages: tuple[dict[str, Any], ...] = ()
    system: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    prediction: str | None = None  # text the answer is expected to mostly repeat
    # Requests of one session run in file order and share history: a "+history" mode drafts
    # from the session's earlier prompts and answers (shell loops, agents, editors).
    session: str | None = None
    # Sent to a server that still holds the session's previous request, as an agent's turns
    # reach `specdec serve`: each side's run starts from the caches that request left (it
    # runs untimed first, the same way), and reuses what the prompt shares with it.
    warm: bool = False
    # Structured workloads: the answer must match `json_schema`, or call one of `tools`
    # (OpenAI's function tools, rendered by the chat template; the call is forced unless
    # tool_choice is "auto": then the model may answer in text, unconstrained; "none": the
    # tools are not offered, as `specdec serve` does, for the turn after a tool's result).
    json_schema: dict | None = None
    tools: tuple[dict, ...] = ()
    tool_choice: str = "required"

    def tokens(self, target: Backend, *, raw: bool, system: str | None) -> list[int]:
        if self.tools and self.tool_choice != "none":  # "none": not offered, as serve does
            messages = list(self.messages) or [{"role": "user", "content": self.text or ""}]
            return encode_chat(target, [dict(m) for m in messages], list(self.tools))
        if not self.messages:
            return prompt_tokens(target, self.text or "", system=self.system or system, raw=raw)
        if raw:  # no template: the contents as plain text
            text = "\n\n".join(m["content"] or "" for m in self.messages)
            return target.tokenize(text, add_special=True)
        return encode_chat(target, [dict(m) for m in self.messages])

    def functions(self) -> list[Function]:
        return [
            Function.of(f["name"], f.get("description"), f.get("parameters"))
            for f in (tool["function"] for tool in self.tools)
        ]

    def structure(self) -> Structure | None:
        if self.json_schema is not None:
            return Structure.json_schema(self.json_schema)
        return forced_call(self.functions()) if self.tools and self.forced else None

    @property
    def forced(self) -> bool:
        return self.tool_choice == "required"

    def valid(self, text: str) -> bool | None:
        """Whether a structured answer parses and matches (None: not a structured prompt)."""
        if self.json_schema is not None:
            try:
                return not schema_errors(json.loads(text), self.json_schema)
            except ValueError:
                return False
        if not self.tools or not self.forced:
            return None
        functions = {f.name: f for f in self.functions()}
        _, calls = split_calls(text, list(functions))
        return len(calls) == 1 and not schema_errors(
            json.loads(calls[0].arguments), functions[calls[0].name].parameters
        )


_PROMPT_FIELDS = {
    "id",
    "category",
    "text",
    "messages",
    "system",
    "max_tokens",
    "prediction",
    "session",
    "warm",
    "json_schema",
    "tools",
    "tool_choice",
}


_FORMAT_FIX = (
    "Each prompt needs id, category, and text or messages (a list of {role, content}); "
    "max_tokens, system, prediction, session (with warm: true), and one of json_schema or "
    "tools (with tool_choice: required, auto or none) are optional. "
    "See specdec_cli/bench/prompts/."
)


def load_prompts(path: Path | None = None) -> list[BenchPrompt]:
    """The built-in suite, or a YAML (list, or {prompts: list}) or JSONL file of prompts, or
    a built-in file by name (BUILTIN_PROMPTS) where no such file exists."""
    source = path or BUILTIN_SUITE
    if not source.exists() and str(source) in BUILTIN_PROMPTS:
        source = BUILTIN_PROMPTS[str(source)]
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadUsageError(
            f"cannot read the prompts file {source}: {exc.strerror or exc}.", "Check the path."
        ) from None
    items = _parse_jsonl(text, source) if _is_jsonl(source, text) else _parse_yaml(text, source)
    prompts = [_parse_prompt(item, source, i) for i, item in enumerate(items, 1)]
    if not prompts:
        raise BadUsageError(f"{source} holds no prompts.", _FORMAT_FIX)
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise BadUsageError(
                f"{source}: the prompt id '{prompt.id}' is used twice.",
                "Give every prompt its own id.",
            )
        seen.add(prompt.id)
    return prompts


def _is_jsonl(path: Path, text: str) -> bool:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    if path.suffix.lower() in (".yaml", ".yml"):
        return False
    return text.lstrip().startswith("{")


def _parse_jsonl(text: str, path: Path) -> list[Any]:
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise BadUsageError(
                f"{path}, line {number}: not valid JSON ({exc.msg}).",
                "Write one JSON object per line. " + _FORMAT_FIX,
            ) from None
    return items


def _parse_yaml(text: str, path: Path) -> list[Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f", line {where.line + 1}" if where is not None else ""
        raise BadUsageError(f"{path}{line}: not valid YAML.", _FORMAT_FIX) from None
    if isinstance(data, dict) and "prompts" in data:
        data = data["prompts"]
    if not isinstance(data, list):
        raise BadUsageError(
            f"{path}: expected a list of prompts (or a mapping with a 'prompts' list).",
            _FORMAT_FIX,
        )
    return data


def _parse_prompt(item: Any, path: Path, index: int) -> BenchPrompt:
    where = f"{path}: prompt {index}"
    if not isinstance(item, dict):
        raise BadUsageError(f"{where} is not a mapping.", _FORMAT_FIX)
    if isinstance(item.get("id"), str) and item["id"].strip():
        where += f" ('{item['id']}')"

    def fail(problem: str) -> BadUsageError:
        return BadUsageError(f"{where}: {problem}.", _FORMAT_FIX)

    unknown = sorted(set(item) - _PROMPT_FIELDS)
    if unknown:
        raise fail(f"unknown field(s) {', '.join(map(str, unknown))}")
    for key in ("id", "category"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise fail(f"'{key}' must be a non-empty string")
    if ("text" in item) == ("messages" in item):
        raise fail("give exactly one of 'text' and 'messages'")
    if "text" in item and (not isinstance(item["text"], str) or not item["text"].strip()):
        raise fail("'text' must be a non-empty string")
    messages = item.get("messages", [])
    if not isinstance(messages, list) or ("messages" in item and not messages):
        raise fail("'messages' must be a non-empty list")
    if not all(_is_message(message) for message in messages):
        raise fail(
            "each message must be {role: string, content: string}; an assistant's may "
            "have tool_calls (and content null), a tool's a tool_call_id"
        )
    for key in ("system", "prediction", "session"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise fail(f"'{key}' must be a string")
    warm = item.get("warm", False)
    if not isinstance(warm, bool) or (warm and "session" not in item):
        raise fail("'warm' is true or false, and true only with a 'session'")
    structured = _structured_fields(item, fail)
    max_tokens = item.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise fail(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    return BenchPrompt(
        id=item["id"].strip(),
        category=item["category"].strip(),
        text=item.get("text"),
        messages=tuple(dict(m) for m in messages),
        system=item.get("system"),
        max_tokens=max_tokens,
        prediction=item.get("prediction"),
        session=item.get("session"),
        warm=warm,
        **structured,
    )


def _is_message(message: object) -> bool:
    if not isinstance(message, dict) or not {"role", "content"} <= set(message):
        return False
    extra = set(message) - {"role", "content"}
    calls = message.get("tool_calls")
    if extra == {"tool_calls"}:
        return message["role"] == "assistant" and isinstance(calls, list) and bool(calls)
    if extra == {"tool_call_id"}:
        fields = (message["role"], message["content"], message["tool_call_id"])
        return message["role"] == "tool" and all(isinstance(v, str) for v in fields)
    return not extra and isinstance(message["role"], str) and isinstance(message["content"], str)


def _structured_fields(item: dict, fail) -> dict:
    """json_schema (checked as run checks one) or tools (OpenAI's function tools)."""
    if "json_schema" in item and "tools" in item:
        raise fail("give at most one of 'json_schema' and 'tools'")
    if "json_schema" in item:
        try:
            Structure.json_schema(item["json_schema"])
        except StructureError as error:
            raise fail(f"'json_schema': {error.message}") from None
        return {"json_schema": item["json_schema"]}
    tools = item.get("tools")
    choice = item.get("tool_choice", "required")
    if choice not in ("required", "auto", "none") or ("tool_choice" in item and tools is None):
        raise fail("'tool_choice' is 'required', 'auto' or 'none', and only with 'tools'")
    if tools is None:
        return {}
    if not isinstance(tools, list) or not tools or not all(_is_tool(t) for t in tools):
        raise fail("'tools' must be a list of {type: function, function: {name, parameters}}")
    return {"tools": tuple(tools), "tool_choice": choice}


def _is_tool(tool: object) -> bool:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return False
    function = tool.get("function")
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("parameters", {}), dict)
    )


def select_prompts(
    prompts: Sequence[BenchPrompt],
    categories: Iterable[str] = (),
    per_category: int | None = None,
) -> list[BenchPrompt]:
    """Keep the named categories (all if none), then the first `per_category` of each."""
    wanted = [c.strip() for item in categories for c in item.split(",") if c.strip()]
    known = list(dict.fromkeys(p.category for p in prompts))
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise BadUsageError(
            f"no prompts in the category {', '.join(unknown)}.",
            f"Categories here: {', '.join(known)}.",
        )
    chosen = [p for p in prompts if not wanted or p.category in wanted]
    if per_category is not None:
        counts: Counter = Counter()
        kept = []
        for prompt in chosen:
            counts[prompt.category] += 1
            if counts[prompt.category] <= per_category:
                kept.append(prompt)
        chosen = kept
    return chosen
