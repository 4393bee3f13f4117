"""OpenAI's chat-completions and completions protocol: requests and errors (the responses
are responses.py's).

Pure data: pydantic models that validate a request body. No HTTP and no models here
(`server.py` and `model_thread.py` do those).

Structured outputs: OpenAI's `response_format` (json_object, json_schema) on chat
completions, and llama-server's own `grammar` (GBNF) and `json_schema` fields on both
endpoints; a schema keyword the grammar would ignore is a 400 naming it (structured.py).

Requests are validated strictly: a field of the wrong type, out of range or unknown is a
400, as OpenAI answers. Fields OpenAI defines that specdec does not implement (`n`,
`best_of`, `echo` ...) are accepted at their neutral value, which clients often
send explicitly, and refused otherwise, so an answer never silently ignores a request.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..decoding.logprobs import MAX_TOP_LOGPROBS
from ..decoding.penalties import BIAS_RANGE, PENALTY_RANGE
from ..services import tool_calls
from ..structured import Structure, StructureError

MAX_STOP_STRINGS = 4  # as OpenAI's API
SEED_BITS = 64  # OpenAI's seed is a signed 64-bit integer
MAX_TEXT_LOGPROBS = 5  # completions' logprobs (alternatives a token), as OpenAI's API

# ---- errors ---------------------------------------------------------------------------------


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# ---- requests -------------------------------------------------------------------------------


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# JSON Schema, and so OpenAI's API document, counts 8.0 as an integer; strict pydantic would not.
Integer = Annotated[int, BeforeValidator(_whole)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


def content_text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def message_text(content: Content | None) -> str:
    """A message's text as chat templates get it: text parts one per line, as llama.cpp
    (and vLLM) join them for templates that take a string."""
    if isinstance(content, list):
        return "\n".join(part.text for part in content)
    return content_text(content)


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call
    # An answer's message sent back as it came (its "refusal" is null); a refusal's text is
    # refused, as it would be ignored.
    refusal: None = None


class FunctionCallIn(_Strict):
    name: str
    arguments: str  # JSON text


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCallIn


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments match the parameters either way when forced


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class ChosenFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: ChosenFunction


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # padding against side channels: nothing to pad


class Prediction(_Strict):
    type: Literal["content"]
    content: Content


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # as OpenAI's
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None  # the answer matches the schema either way


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structure(self) -> Structure | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Structure.json_object()
        if self.json_schema is None:
            raise bad_request(
                "response_format of type json_schema needs its json_schema.",
                "response_format.json_schema",
            )
        schema = self.json_schema.json_schema
        return Structure.json_object() if schema in (None, True, {}) else _schema(schema)


def _schema(schema: object, param: str = "response_format.json_schema.schema") -> Structure:
    try:
        return Structure.json_schema(schema)
    except StructureError as error:
        raise bad_request(str(error), param) from None


class _Sampling(_Strict):
    """Fields both endpoints take. None means: the server's default (its command line)."""

    model: str | None = None
    max_tokens: Integer | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: Integer | None = Field(None, ge=0)  # llama.cpp's extension; 0: all tokens
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # llama.cpp's extension
    frequency_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    presence_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    seed: Integer | None = Field(None, ge=-(2 ** (SEED_BITS - 1)), lt=2 ** (SEED_BITS - 1))
    stop: str | list[str] | None = None
    stream: bool | None = None  # null: not streamed, as when left out
    stream_options: StreamOptions | None = None
    prediction: Prediction | None = None
    # llama-server's structured outputs (GBNF; a JSON schema), on both endpoints.
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # OpenAI fields accepted at their neutral value only (see the module docstring).
    n: Integer | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Clients send these for bookkeeping; they change nothing in the answer.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    safety_identifier: str | None = None  # OpenAI's `user`, renamed
    prompt_cache_key: str | None = None  # specdec's caches are kept per key (--api-key)
    service_tier: str | None = None  # a processing tier: one model thread has only one

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise bad_request(f"stop takes at most {MAX_STOP_STRINGS} strings.", "stop")
        return tuple(s for s in stops if s)

    def engine_seed(self) -> int | None:
        """The engine's seeds are not negative: the seed's 64 bits, read unsigned."""
        return None if self.seed is None else self.seed % 2**SEED_BITS

    def bias(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, amount) pairs, in token order."""
        pairs = []
        for key, amount in (self.logit_bias or {}).items():
            if not re.fullmatch(r"[0-9]{1,10}", key):
                raise bad_request(
                    f"logit_bias: {key!r} is not a token id: keys are token ids, as strings.",
                    "logit_bias",
                )
            if not BIAS_RANGE[0] <= amount <= BIAS_RANGE[1]:
                raise bad_request(
                    f"logit_bias: {amount} for token {key} is outside -100 to 100.", "logit_bias"
                )
            pairs.append((int(key), float(amount)))
        return tuple(sorted(pairs))

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def prediction_text(self) -> str | None:
        return None if self.prediction is None else content_text(self.prediction.content)

    def structure(self) -> Structure | None:
        """What the answer must be: `grammar` or `json_schema` (see ChatCompletionRequest)."""
        given = self._constraints_given()
        if len(given) > 1:
            raise bad_request(f"{' and '.join(given)} both constrain the answer: send one.")
        if self.grammar is not None:
            try:
                return Structure.grammar(self.grammar)
            except StructureError as error:
                raise bad_request(str(error), "grammar") from None
        if self.json_schema is not None:
            return _schema(self.json_schema, "json_schema")
        return None

    def _constraints_given(self) -> list[str]:
        return [name for name in ("grammar", "json_schema") if getattr(self, name) is not None]

    def check_supported(self) -> None:
        """Refuse what specdec would otherwise silently ignore."""
        neutral = {
            "n": (self.n, (None, 1), "only n=1 is supported"),
        }
        for param, (value, allowed, why) in neutral.items():
            if value not in allowed:
                raise bad_request(f"{param}={value!r}: {why}.", param)
        self.bias()
        if self.service_tier not in (None, "auto", "default"):
            raise bad_request(
                f"service_tier={self.service_tier!r}: this server has one tier ('default').",
                "service_tier",
            )
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true.", "stream_options")
        self.stop_strings()
        self.structure()


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Integer | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: Integer | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    modalities: list[Literal["text"]] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_alternatives(self) -> int | None:
        """How many alternatives each token's log-probability comes with; None: none."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def structure(self) -> Structure | None:
        forced = self.forced_functions()
        if self.response_format is not None and self.response_format.type != "text":
            given = self._constraints_given() + (["tool_choice"] if forced else [])
            if given:
                raise bad_request(f"response_format and {given[0]} both constrain the answer.")
            return self.response_format.structure()
        if forced:
            if self._constraints_given():
                raise bad_request(f"tool_choice and {self._constraints_given()[0]} both "
                                  "constrain the answer.")  # fmt: skip
            return tool_calls.forced_call(forced)
        return super().structure()

    # -- tools ------------------------------------------------------------------------------

    def functions(self) -> list[tool_calls.Function]:
        """The tools the model may call now (none when tool_choice is "none")."""
        if not self.tools or self.tool_choice == "none":
            return []
        return [
            tool_calls.Function.of(t.function.name, t.function.description, t.function.parameters)
            for t in self.tools
        ]

    def forced_functions(self) -> list[tool_calls.Function]:
        """The functions one of which must be called: all ("required"), or the named one."""
        functions = self.functions()
        if self.tool_choice == "required":
            return functions
        if isinstance(self.tool_choice, NamedToolChoice):
            return [f for f in functions if f.name == self.tool_choice.function.name]
        return []

    def template_tools(self) -> list[dict] | None:
        functions = self.functions()
        return [f.template_entry() for f in functions] if functions else None

    def chat_messages(self, default_system: str | None) -> list[dict]:
        """Messages for the chat template; `developer` is the newer name for `system`.
        The server's --system applies when the request has no system message. Earlier tool
        calls carry their arguments as objects (what templates render)."""
        messages = [_template_message(i, m) for i, m in enumerate(self.messages)]
        if default_system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": default_system})
        return messages

    def check_supported(self) -> None:
        self._check_tools()  # before the structure a forced call makes of them
        super().check_supported()
        if self.top_logprobs and not self.logprobs:  # 0 asks for nothing: a neutral value
            raise bad_request("top_logprobs needs logprobs: true.", "top_logprobs")
        if self.reasoning_effort is not None:
            raise bad_request(
                "reasoning_effort is not supported: this server's model does not reason "
                "before answering.",
                "reasoning_effort",
            )
        for i, message in enumerate(self.messages):
            if message.content is None and message.role != "assistant":
                raise bad_request(f"messages[{i}].content is required.", f"messages.{i}.content")
            if message.tool_call_id is None and message.role == "tool":
                raise bad_request(
                    f"messages[{i}].tool_call_id is required: which call this answers.",
                    f"messages.{i}.tool_call_id",
                )
        self.chat_messages(None)  # earlier calls' arguments parse

    def _check_tools(self) -> None:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise bad_request("two tools have the same name.", "tools")
        for i, tool in enumerate(self.tools or []):
            if tool.function.parameters is not None:
                _schema(tool.function.parameters, f"tools.{i}.function.parameters")
        if self.tool_choice == "required" and not names:
            raise bad_request("tool_choice is 'required' but there are no tools.", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            wanted = self.tool_choice.function.name
            if wanted not in names:
                raise bad_request(
                    f"tool_choice names the function '{wanted}', which is not among the tools.",
                    "tool_choice",
                )


def _template_message(index: int, message: Message) -> dict:
    role = "system" if message.role == "developer" else message.role
    rendered: dict = {"role": role, "content": message_text(message.content)}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments, index, n),
                },
            }
            for n, call in enumerate(message.tool_calls)
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(text: str, message: int, call: int) -> dict:
    param = f"messages.{message}.tool_calls.{call}.function.arguments"
    try:
        return tool_calls.arguments_object(text, param)
    except ValueError as error:
        raise bad_request(str(error), param) from None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]  # OpenAI's four forms
    echo: bool | None = None
    suffix: str | None = None
    best_of: Integer | None = None
    logprobs: Integer | None = Field(None, ge=0, le=MAX_TEXT_LOGPROBS)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def logprob_alternatives(self) -> int | None:
        return self.logprobs

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if any(not isinstance(part, str) for part in self.prompt):
            raise bad_request("prompt as token ids is not supported: send text.", "prompt")
        if len(self.prompt) != 1:
            raise bad_request(
                f"prompt: {len(self.prompt)} prompts in one request are not supported: send "
                "one string per request.",
                "prompt",
            )
        return str(self.prompt[0])

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise bad_request("echo is not supported.", "echo")
        if self.best_of not in (None, 1):
            raise bad_request("only best_of=1 is supported.", "best_of")
        self.prompt_text()


RequestT = TypeVar("RequestT", bound="_Sampling")


def parse_request(body: bytes, model: type[RequestT]) -> RequestT:
    """A validated request, or an ApiError(400) naming the first problem."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as error:
        raise _validation_error(error) from None
    request.check_supported()
    return request


def _validation_error(error: ValidationError) -> ApiError:
    problems = error.errors(include_url=False)
    if any(p["type"] == "json_invalid" for p in problems):
        return bad_request("We could not parse the JSON body of your request: invalid JSON.")
    for part in problems:  # a content part of a kind the model cannot take in
        kind = part["input"] if part["type"] == "literal_error" else None
        if part["loc"][-1:] == ("type",) and "content" in part["loc"] and kind != "text":
            where = ".".join(str(p) for p in part["loc"][:-2] if not _is_union_label(p))
            return bad_request(
                f"{kind!r} content is not supported (images, audio, files): send text.", where
            )
    # A union reports one error per branch; the one that got furthest is the useful one.
    problem = max(problems, key=lambda p: len(p["loc"]))
    loc = [str(part) for part in problem["loc"] if not _is_union_label(part)]
    param = ".".join(loc) or None
    if problem["type"] == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param)
    if problem["type"] == "missing":
        return bad_request(f"Missing required parameter: {param}", param)
    if param is None:
        return bad_request(f"The request body is not valid: {problem['msg']}.")
    return bad_request(f"Invalid value for {param}: {problem['msg']}.", param)


def _is_union_label(part: str | int) -> bool:
    """pydantic names union branches in error locations ('str', 'list[TextPart]')."""
    return isinstance(part, str) and bool(
        re.search(r"\[|^[A-Z]", part) or part in ("str", "int", "float", "bool")
    )
