"""`specdec serve`: OpenAI's HTTP API over one loaded model pair.

Each route checks the key, validates the body (`serve_protocol`), hands a `Job` to the one
model thread (`model_thread.py`) and sends back what the model thread posts: one JSON body, or
server-sent events as the tokens come. A client that goes away cancels its job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from ..decoding.engine import GenerationSettings
from ..request import DecodeRequest
from .guard import Guard, GuardMiddleware
from .model_thread import (
    ChatPrompt,
    Failed,
    Failure,
    Job,
    ModelThread,
    ServeError,
    Started,
    TextPrompt,
    shutting_down,
)
from .render_serve import RequestLog, RequestRecord
from .responses import (
    Answer,
    ChatShape,
    Delta,
    ResponseIds,
    TextShape,
    ToolCallShape,
    model_card,
)
from .serve_protocol import ApiError, ChatCompletionRequest, CompletionRequest, parse_request

MAX_BODY_BYTES = 32 * 1024 * 1024
# Request fields that override the server's defaults (its command line), by their names in
# SamplingSettings and Penalties.
SAMPLING_FIELDS = {f: f for f in ("temperature", "top_k", "top_p", "min_p")}
PENALTY_FIELDS = {"frequency_penalty": "frequency", "presence_penalty": "presence"}


class ServerState:
    """What the routes share: the model thread, the defaults, the model's names, the log."""

    def __init__(
        self,
        model_thread: ModelThread,
        decode: DecodeRequest,
        *,
        aliases: tuple[str, ...] = (),
        api_keys: tuple[str, ...] = (),
        log: RequestLog,
        speaks_tools: bool = False,  # the target's chat template renders tools
        context_tokens: int | None = None,  # the target's context: prompt and answer
    ) -> None:
        self.model_thread = model_thread
        self.decode = decode
        self.defaults = decode.generation_settings()
        self.model_id = decode.target.stem
        self.model_names = {self.model_id, decode.target.name, *aliases}
        self.created = int(decode.target.stat().st_mtime) if decode.target.exists() else 0
        self.api_keys = api_keys
        self.log = log
        self.speaks_tools = speaks_tools
        self.context_tokens = context_tokens
        self._draining: set[asyncio.Task] = set()
        self._noted_another_name = False

    def authorize(self, request: Request) -> str | None:
        """Whose request it is: "key N" for the N-th --api-key (never the key itself), None
        on a server without keys."""
        if not self.api_keys:
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = token.strip().encode()
        matches = [hmac.compare_digest(given, key.encode()) for key in self.api_keys]
        if not any(matches):
            raise ApiError(
                401,
                "Incorrect API key provided.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return f"key {matches.index(True) + 1}"

    def note_model_name(self, name: str | None) -> None:
        """A completion request may name any model, as with llama-server: clients are often
        configured with another server's name. The response's `model` says which answered;
        the log says so once, for the first other name."""
        if name is None or name in self.model_names or self._noted_another_name:
            return
        self._noted_another_name = True
        self.log.notice(
            f"a request names the model `{name}`: `{self.model_id}` answers it, and requests "
            "naming any other model too (not noted again)"
        )

    def check_model(self, name: str | None) -> None:
        """GET /v1/models/NAME: only this server's own model exists."""
        if name is not None and name not in self.model_names:
            raise ApiError(
                404,
                f"The model `{name}` does not exist. This server serves `{self.model_id}`.",
                param="model",
                code="model_not_found",
            )

    def settings_for(
        self, request: ChatCompletionRequest | CompletionRequest
    ) -> GenerationSettings:
        """The server's defaults (its command line), overridden by what the request sets."""
        self._check_token_limit(request)
        base = self.defaults
        return replace(
            base,
            max_tokens=request.token_limit() or base.max_tokens,
            stop=base.stop if request.stop is None else request.stop_strings(),
            sampling=replace(base.sampling, **_given(request, SAMPLING_FIELDS)),
            seed=base.seed if request.seed is None else request.engine_seed(),
            structure=request.structure(),
            logprobs=request.logprob_alternatives(),
            penalties=replace(base.penalties, **_given(request, PENALTY_FIELDS)),
            logit_bias=request.bias(),
        )

    def _check_token_limit(self, request: ChatCompletionRequest | CompletionRequest) -> None:
        """A limit the context could never hold is refused, as OpenAI refuses one above the
        model's most completion tokens (a prompt that leaves too little room is not)."""
        limit = request.token_limit()
        if limit is None or self.context_tokens is None or limit < self.context_tokens:
            return
        param = "max_tokens" if limit == request.max_tokens else "max_completion_tokens"
        raise ApiError(
            400,
            f"{param} is too large: {limit}. This model's context holds {self.context_tokens} "
            "tokens, the prompt included.",
            param=param,
            code="invalid_value",
        )

    def log_when_done(self, job: Job, record: RequestRecord) -> None:
        """Log a request whose client left once the model thread has stopped its job."""

        async def drain() -> None:
            error = "the client closed the request"
            while True:
                message = await job.next()
                if isinstance(message, Answer):
                    record.stats = message.finished.stats
                    record.finish_reason = message.finished.finish_reason
                    break
                if isinstance(message, Failed):  # how far it got, where the message says
                    error = message.error.message.rstrip(".")
                    break
            record.status, record.error = 499, error
            self.log.write(record)

        task = asyncio.ensure_future(drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)


def _given(request: ChatCompletionRequest | CompletionRequest, fields: dict[str, str]) -> dict:
    """The `fields` the request sets (null is left out), under their names in the settings."""
    values = {name: getattr(request, field) for field, name in fields.items()}
    return {name: value for name, value in values.items() if value is not None}


def create_app(state: ServerState, guard: Guard | None = None) -> FastAPI:
    app = FastAPI(title="specdec", docs_url=None, redoc_url=None, openapi_url=None)
    if guard is not None:
        app.add_middleware(GuardMiddleware, guard=guard, refused=_refusal_logger(state))

    async def chat_completions(request: Request) -> Response:
        return await _complete(
            request, state, ChatCompletionRequest, ChatShape(), _chat_prompt(state)
        )

    async def completions(request: Request) -> Response:
        return await _complete(request, state, CompletionRequest, TextShape(), _text_prompt)

    async def list_models(request: Request) -> Response:
        return _logged(request, state, lambda: {"object": "list", "data": [_card(state)]})

    async def get_model(request: Request, model_id: str) -> Response:
        def card() -> dict:
            state.check_model(model_id)
            return _card(state)

        return _logged(request, state, card)

    async def health() -> dict:
        model_thread = state.model_thread
        shared = model_thread.shared_passes()
        return {
            **({"shared_passes": shared} if shared is not None else {}),
            "status": "ok",
            "model": state.model_id,
            "busy": model_thread.busy,
            "slots": model_thread.slots,
            "busy_slots": model_thread.busy_slots,
            "queued": model_thread.queued,
            "max_queue": model_thread.max_queue,
            "received": model_thread.received,
        }

    # The same routes without /v1, as llama.cpp's server has them, for clients whose base
    # URL leaves it out.
    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/models", list_models, methods=["GET"])
        app.add_api_route(f"{prefix}/models/{{model_id:path}}", get_model, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Invalid method for URL ({request.method} {request.url.path})"
        else:
            message = str(exc.detail)
        error = ApiError(exc.status_code, message, headers=dict(exc.headers or {}))  # 405: Allow
        record = RequestRecord(request.method, request.url.path, time.perf_counter())
        return _failed(state, record, error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        error = ApiError(500, f"Internal error: {type(exc).__name__}", kind="server_error")
        return JSONResponse(error.body(), status_code=500)

    return app


def _refusal_logger(state: ServerState) -> Callable[[Scope, ApiError], None]:
    def refused(scope: Scope, error: ApiError) -> None:
        record = RequestRecord(scope["method"], scope["path"], time.perf_counter())
        record.status, record.error = error.status, error.message
        state.log.write(record)

    return refused


def _card(state: ServerState) -> dict:
    return model_card(state.model_id, state.created)


def _chat_prompt(state: ServerState) -> Callable[[ChatCompletionRequest], ChatPrompt]:
    def prompt(request: ChatCompletionRequest) -> ChatPrompt:
        tools = request.template_tools()
        if tools and not state.speaks_tools:
            raise ApiError(
                400,
                f"This model's chat template cannot express tools ({state.model_id}); "
                "use a model whose template renders them, such as Qwen2.5's.",
                param="tools",
            )
        return ChatPrompt(request.chat_messages(state.decode.system), tools)

    return prompt


def _text_prompt(request: CompletionRequest) -> TextPrompt:
    return TextPrompt(request.prompt_text(), request.suffix or None)


def _logged(request: Request, state: ServerState, body: Callable[[], dict]) -> Response:
    record = RequestRecord(request.method, request.url.path, time.perf_counter())
    try:
        state.authorize(request)
        response = JSONResponse(body())
    except ApiError as error:
        return _failed(state, record, error)
    state.log.write(record)
    return response


def _failed(state: ServerState, record: RequestRecord, error: ApiError) -> Response:
    record.status, record.error = error.status, error.message
    state.log.write(record)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _complete(
    request: Request,
    state: ServerState,
    request_type: type[ChatCompletionRequest] | type[CompletionRequest],
    shape: ChatShape | TextShape | ToolCallShape,
    make_prompt: Callable[..., ChatPrompt | TextPrompt],
) -> Response:
    record = RequestRecord(request.method, request.url.path, time.perf_counter())
    try:
        owner = state.authorize(request)
        parsed = parse_request(await _read_body(request), request_type)
        record.stream = bool(parsed.stream)
        if isinstance(parsed, ChatCompletionRequest) and (functions := parsed.functions()):
            names = [function.name for function in functions]
            shape = ToolCallShape(names, parallel=parsed.parallel_tool_calls is not False)
        state.note_model_name(parsed.model)
        loop = asyncio.get_running_loop()
        job = Job(
            make_prompt(parsed), state.settings_for(parsed), parsed.prediction_text(), loop, owner
        )
        try:
            state.model_thread.submit(job)
        except ServeError as error:
            raise api_error(error) from None
        started = await _unless_disconnected(request, job, _started(job))
        if started is None:
            state.log_when_done(job, record)
            return Response(status_code=499)
        record.prompt_tokens, record.cached_tokens = started.prompt_tokens, started.cached_tokens
        ids = ResponseIds.new(shape.prefix, state.model_id)
        record.id = ids.id
        if parsed.stream:
            events = _events(job, ids, shape, parsed.include_usage(), record, state)
            return _EventStream(events, job)
        answer = await _unless_disconnected(request, job, _answer(job))
        if answer is None:
            state.log_when_done(job, record)
            return Response(status_code=499)
    except ApiError as error:
        return _failed(state, record, error)
    record.stats, record.finish_reason = answer.finished.stats, answer.finished.finish_reason
    state.log.write(record)
    return JSONResponse(shape.whole(ids, answer))


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _too_large()
    return bytes(body)


def api_error(error: ServeError) -> ApiError:
    """The model thread's failure in OpenAI's error shape."""
    failure, message, param = error.failure, error.message, error.param
    if failure is Failure.BAD_PROMPT:
        return ApiError(400, message, param=param)
    if failure is Failure.TOO_LONG:
        return ApiError(400, message, param=param, code="context_length_exceeded")
    if failure is Failure.QUEUE_FULL:
        headers = {"Retry-After": "1"}
        return ApiError(503, message, kind="server_error", code="queue_full", headers=headers)
    if failure is Failure.SHUTTING_DOWN:
        return ApiError(503, message, kind="server_error")
    if failure is Failure.CLIENT_GONE:
        return ApiError(499, message)
    if failure is Failure.DECODE_FAILED:
        return ApiError(500, message, kind="server_error", code="decode_failed")
    if failure is Failure.UNAVAILABLE:
        return ApiError(503, message, kind="server_error", code="backend_unavailable")
    return ApiError(500, message, kind="server_error")


def _too_large() -> ApiError:
    return ApiError(413, f"The request body is larger than {MAX_BODY_BYTES // 2**20} MiB.")


async def _started(job: Job) -> Started:
    message = await job.next()
    if isinstance(message, Failed):
        raise api_error(message.error)
    assert isinstance(message, Started), message
    return message


async def _answer(job: Job) -> Answer:
    while True:
        message = await job.next()
        if isinstance(message, Answer):
            if message.finished.finish_reason == "interrupted":
                # only shutdown stops a job whose client is still there
                raise api_error(shutting_down())
            return message
        if isinstance(message, Failed):
            raise api_error(message.error)


async def _unless_disconnected(request: Request, job: Job, awaitable: Awaitable):
    """The awaitable's result, or None (and the job cancelled) if the client goes first."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    if work.done() and not work.cancelled():
        return work.result()
    job.cancel()
    return None


async def _disconnect(request: Request) -> None:
    # The body has been read, so the next message the server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(
    job: Job,
    ids: ResponseIds,
    shape: ChatShape | TextShape | ToolCallShape,
    with_usage: bool,
    record: RequestRecord,
    state: ServerState,
) -> AsyncGenerator[str, None]:
    ended = False
    try:
        for chunk in shape.opening(ids, with_usage):
            yield _sse(chunk)
        while not ended:
            message = await job.next()
            if isinstance(message, Delta):
                delta = shape.delta(ids, message, with_usage)
                if delta is not None:  # a tool call's text is held back
                    yield _sse(delta)
                # Writing does not yield to the event loop, and pieces already waiting are
                # read without it: let it run, so a client that left is noticed now rather
                # than after every waiting piece was written to a closed socket.
                await asyncio.sleep(0)
                continue
            ended = True
            error = api_error(message.error) if isinstance(message, Failed) else None
            if isinstance(message, Answer):
                record.stats = message.finished.stats
                record.finish_reason = message.finished.finish_reason
                if record.finish_reason == "interrupted":
                    error = api_error(shutting_down())
            if error is None:
                assert isinstance(message, Answer)  # Started never comes twice; Failed has an error
                state.log.write(record)
                for chunk in shape.closing(ids, message, with_usage):
                    yield _sse(chunk)
                yield "data: [DONE]\n\n"
            else:  # the headers are sent: the error goes in the stream
                record.status, record.error = error.status, error.message
                state.log.write(record)
                yield _sse(error.body())
    finally:
        if not ended:  # the client went away mid-stream
            job.cancel()
            state.log_when_done(job, record)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _EventStream(StreamingResponse):
    """Server-sent events. Starlette stops the stream when the client disconnects; this
    also makes sure the job is cancelled and the generator closed right then."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[str, None], job: Job) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._job.cancel()  # nothing left to do when the answer is complete
            await self._events.aclose()
