"""The one thread that owns the models. Requests wait in a bounded queue and run one at a
time, in arrival order (llama.cpp contexts are not re-entrant).

The async side hands over a `Job` and reads what the model thread posts to it: `Started` once
the prompt is tokenised and fits, then text deltas (str), then the `Answer`; or `Failed`.
A job whose client went away is cancelled: the model thread checks between engine events and
stops iterating, which is all it takes to stop the engine.

Both models' KV caches are kept between requests. `logits_for_suffix` compares each new
prompt with what a cache holds and decodes only the rest, so a chat client resending the
whole conversation pays only for the new turn. Unlike `chat.py`, the prompt is always
tokenised afresh from the request: the answer to a request must not depend on which
requests came before it (they may be another client's).
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from enum import Enum

from ..commands.prompting import check_prompt_fits, prediction_tokens, prompt_tokens
from ..decoding.backend import encode_chat
from ..decoding.drafters import Drafter
from ..decoding.engine import Finished, Generation, GenerationSettings, Piece
from ..decoding.history import HistoryIndex
from ..decoding.modes import use_history
from ..errors import ChatTemplateError, ContextOverflowError, DecodeError, SpecdecError
from ..models import rpc
from ..models.loading import ModelPair
from ..structured import StructureError
from .serve_protocol import Answer


class Failure(Enum):
    """Why the model thread could not answer; server.py says it in HTTP (api_error)."""

    BAD_PROMPT = "bad_prompt"  # the request's own doing: it cannot be answered as it is
    TOO_LONG = "too_long"  # the prompt does not fit the context
    QUEUE_FULL = "queue_full"
    SHUTTING_DOWN = "shutting_down"
    CLIENT_GONE = "client_gone"  # it left while its request waited
    DECODE_FAILED = "decode_failed"  # llama.cpp could not evaluate a batch
    UNAVAILABLE = "unavailable"  # an --rpc worker holding the target's layers is gone
    INTERNAL = "internal"  # a bug (logged with its traceback), or the machine's doing


class ServeError(Exception):
    def __init__(self, failure: Failure, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.param = param  # the request field at fault, where there is one


def shutting_down() -> ServeError:
    return ServeError(Failure.SHUTTING_DOWN, "The server is shutting down.")


def bad_prompt(message: str, param: str | None = None) -> ServeError:
    return ServeError(Failure.BAD_PROMPT, message, param)


def _failure_of(error: SpecdecError) -> Failure:
    """What a failure during a generation is, for the HTTP status it gets."""
    if isinstance(error, ContextOverflowError):
        return Failure.TOO_LONG
    if isinstance(error, DecodeError):
        return Failure.DECODE_FAILED
    if isinstance(error, rpc.WorkerError):
        return Failure.UNAVAILABLE
    if isinstance(error, StructureError):  # the grammar led where no token is allowed
        return Failure.BAD_PROMPT
    return Failure.INTERNAL


@dataclass(frozen=True)
class ChatPrompt:
    messages: list[dict]
    tools: list[dict] | None = None  # the functions the model may call (OpenAI's shape)


@dataclass(frozen=True)
class TextPrompt:
    text: str  # raw completion: as `specdec run --raw`


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Failed:
    error: ServeError


Message = Started | str | Answer | Failed


class Job:
    """One request's work. Created on the event loop; the model thread posts back to it."""

    def __init__(
        self,
        prompt: ChatPrompt | TextPrompt,
        settings: GenerationSettings,
        prediction: str | None,
        loop: asyncio.AbstractEventLoop,
        owner: str | None = None,
    ) -> None:
        """`owner`: whose request it is (the API key's label), or None without keys."""
        self.prompt = prompt
        self.settings = settings
        self.prediction = prediction
        self.owner = owner
        self._loop = loop
        self._messages: asyncio.Queue[Message] = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def next(self) -> Message:
        return await self._messages.get()

    def post(self, message: Message) -> None:
        """Called from the models thread."""
        try:
            self._loop.call_soon_threadsafe(self._messages.put_nowait, message)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()


class ModelThread:
    def __init__(
        self,
        pair: ModelPair,
        drafter: Drafter | None,
        *,
        max_queue: int,
        history_tokens: int = 0,
    ) -> None:
        """`history_tokens`: each owner's finished prompts and answers, up to this many
        tokens, are what the drafter drafts from for that owner's requests (0: none). One
        owner's text is never drafted into another's answers, and neither is the KV cache
        one left behind reused for another (its `cached_tokens` would tell)."""
        self.pair = pair
        self.drafter = drafter
        self.history_tokens = history_tokens
        self.histories: dict[str | None, HistoryIndex] = {}
        self._cache_owner: str | None = None
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._current: Job | None = None
        self._closed = False
        self.received = 0  # jobs accepted since the start
        self._thread = threading.Thread(target=self._serve, name="specdec-models", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._current is not None

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def submit(self, job: Job) -> None:
        if self._closed:
            raise shutting_down()
        try:
            self._jobs.put_nowait(job)
            self.received += 1
        except queue.Full:
            raise ServeError(
                Failure.QUEUE_FULL,
                f"The server is busy: {self.max_queue} requests are already waiting. "
                "Retry shortly.",
            ) from None

    def stop_all(self) -> None:
        """Cancel the running job and every waiting one (the server is shutting down)."""
        self._closed = True
        current = self._current
        if current is not None:
            current.cancel()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.post(Failed(shutting_down()))

    def close(self, timeout: float = 10.0) -> None:
        self.stop_all()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    # -- the models thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled:  # its client left while it waited
                job.post(Failed(ServeError(Failure.CLIENT_GONE, "The client closed the request.")))
                continue
            self._current = job
            clean, failure = True, None
            try:
                self._run(job)
            except ServeError as error:
                failure = error
            except SpecdecError as error:  # not the request's doing: it was checked before
                clean, failure = False, ServeError(_failure_of(error), str(error))
            except Exception as error:  # a bug: say so, keep serving
                traceback.print_exc(file=sys.stderr)
                message = f"Internal error: {type(error).__name__}: {error}"
                clean, failure = False, ServeError(Failure.INTERNAL, message)
            self._settle_caches(clean)  # before the client hears back: the next job may be its
            self._current = None
            if failure is not None:
                job.post(Failed(failure))

    def history_of(self, owner: str | None) -> HistoryIndex | None:
        if self.history_tokens <= 0:
            return None
        if owner not in self.histories:
            self.histories[owner] = HistoryIndex(self.history_tokens)
        return self.histories[owner]

    def _hand_over_caches(self, owner: str | None) -> None:
        """Another owner's request starts from empty caches."""
        if owner != self._cache_owner:
            self.pair.reset()
            self._cache_owner = owner

    def _run(self, job: Job) -> None:
        target = self.pair.target
        self._hand_over_caches(job.owner)
        history = self.history_of(job.owner)
        use_history(self.drafter, history)
        prompt = self._tokens(job.prompt)
        try:
            check_prompt_fits(prompt, target.n_ctx)
        except SpecdecError as error:
            param = "messages" if isinstance(job.prompt, ChatPrompt) else "prompt"
            raise ServeError(Failure.TOO_LONG, str(error), param) from None
        settings = job.settings
        if job.prediction:  # tokenised as run does it (prompting.py)
            settings = replace(settings, prediction=prediction_tokens(target, job.prediction))
        cached = target.prompt_reuse(prompt)
        drafter = self.drafter if settings.draft_max > 0 else None
        try:
            generation = Generation(target, prompt, settings, drafter=drafter)
        except StructureError as error:  # the grammar does not parse: before any answer
            raise bad_prompt(str(error)) from None
        job.post(Started(len(prompt), cached))

        events = generation.events()
        finished: Finished | None = None
        try:
            for event in events:
                if job.cancelled:  # the client went away: stop here, between two rounds
                    break
                if isinstance(event, Piece) and event.text:
                    job.post(event.text)
                elif isinstance(event, Finished):
                    finished = event
        finally:
            events.close()
        if finished is not None and history is not None:
            history.add_turn(prompt, finished.tokens)  # a resent conversation: its new part
        job.post(Answer(finished or generation.interrupted(), len(prompt), cached))

    def _tokens(self, prompt: ChatPrompt | TextPrompt) -> list[int]:
        target = self.pair.target
        if isinstance(prompt, TextPrompt):
            tokens = prompt_tokens(target, prompt.text, system=None, raw=True)
        else:
            if target.chat_template() is None:
                raise bad_prompt(
                    "This model has no chat template; use /v1/completions with a raw prompt."
                )
            try:
                tokens = encode_chat(target, prompt.messages, prompt.tools)
            except ChatTemplateError as error:
                raise bad_prompt(error.message, "messages") from None
        if not tokens:
            raise bad_prompt("The prompt is empty.", "prompt")
        return tokens

    def _settle_caches(self, clean: bool) -> None:
        """Leave both KV caches matching their token lists. After a clean end they already
        do (this drops nothing); after an error in the middle of a decode, start over."""
        for backend in (self.pair.target, self.pair.drafter):
            if backend is not None:
                try:
                    backend.truncate(len(backend.cached) if clean else 0)
                except RuntimeError:  # llama.cpp refused a partial removal: clear it all
                    backend.truncate(0)
