"""llama.cpp's Jinja rendering of an OpenAI chat request, written again for the tests: the
reference that the prompts specdec decodes are compared with.

What `llama-server --jinja` hands the template (common/chat.cpp): each tool as
{"type", "function": {"name", "description" ("" when none), "parameters"}}, in that order;
an assistant turn that only calls has content ""; the text parts of a content list are
joined with newlines; a call's `arguments` (JSON text in OpenAI's API) are parsed into an
object for templates that print them with `tojson` (Qwen2.5's and these tests' own). The
template then renders as Transformers renders it: trim_blocks, lstrip_blocks, `tojson` as
json.dumps without ASCII escapes or sorted keys.
"""

from __future__ import annotations

import json

from jinja2.sandbox import ImmutableSandboxedEnvironment


def llama_cpp_prompt(template: str, request: dict, *, bos: str, eos: str) -> str:
    """`request` (an OpenAI chat body) through `template`, ready for the assistant's reply."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = _tojson
    return environment.from_string(template).render(
        messages=[_message(m) for m in request["messages"]],
        tools=_tools(request.get("tools")),
        add_generation_prompt=True,
        bos_token=bos,
        eos_token=eos,
        raise_exception=_raise,
    )


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise(message: str) -> None:
    raise ValueError(message)


def _tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description") or "",
                "parameters": tool["function"].get("parameters")
                or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


def _message(message: dict) -> dict:
    role = "system" if message["role"] == "developer" else message["role"]
    rendered: dict = {"role": role, "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        rendered["tool_calls"] = [_call(call) for call in message["tool_calls"]]
    if "tool_call_id" in message:
        rendered["tool_call_id"] = message["tool_call_id"]
    return rendered


def _text(content: str | list[dict] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def _call(call: dict) -> dict:
    function = call["function"]
    arguments = json.loads(function["arguments"])
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments},
            "id": call["id"]}  # fmt: skip
