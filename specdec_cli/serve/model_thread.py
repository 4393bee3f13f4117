"""The threads that own the models. Requests wait in a bounded queue and are handed, in
arrival order, to the slots (`serve --parallel N`, one by default): each slot answers one
request at a time, on its own KV sequences; the slots' generated rows share each target
pass (models/rounds.py), and each answer stays the one it would get alone.

The async side hands over a `Job` and reads what the model thread posts to it: `Started` once
the prompt is tokenised and fits, then `Delta`s (text, and its tokens' logprobs where asked),
then the `Answer`; or `Failed`.
A job whose client went away is cancelled: the model thread checks between prompt steps
(PREFILL_STEP tokens) and between engine events, and stops, which is all it takes to stop
the engine (and free the slot).

Each slot's KV caches are kept between requests, and a request goes to the idle slot whose
cache (its owner's) would serve most of its prompt. `choices_for_suffix` compares each new
prompt with what a cache holds and decodes only the rest, so a chat client resending the
whole conversation pays only for the new turn. Unlike `chat.py`, the prompt is always
tokenised afresh from the request: the answer to a request must not depend on which
requests came before it (they may be another client's).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from enum import Enum

from ..decoding.backend import (
    Backend,
    DecodeStopped,
    choices_for_suffix,
    encode_chat,
    stoppable,
)
from ..decoding.engine import Finished, Generation, GenerationSettings, Piece
from ..decoding.history import HistoryIndex
from ..decoding.logprobs import TokenLogprob
from ..decoding.modes import use_history
from ..errors import (
    ChatTemplateError,
    ContextOverflowError,
    DecodeError,
    ModelFileError,
    SpecdecError,
)
from ..llama import rpc
from ..models.loading import ModelPair
from ..services.lifecycle import Slot
from ..services.prompting import (
    check_prompt_fits,
    fill_in_middle_tokens,
    prediction_tokens,
    prompt_tokens,
)
from ..structured import StructureError
from .responses import Answer, Delta, TokenLogprobs

# A request's prompt is decoded this many tokens at a time, so that a client that leaves
# during a long prompt frees its slot within one step (about a second for a 1.5B target on
# 2 cores). A multiple of exact mode's prompt chunk (128), where exact prompts are cut anyway.
PREFILL_STEP = 128
# A slot's cache counts toward giving it a job only in whole blocks of this many tokens the
# prompt shares with it (exact mode's prompt chunk): a shared BOS or chat-template preamble
# must not send a new conversation to another's cache rather than to an empty slot.
SLOT_REUSE_BLOCK = 128


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


def client_gone(progress: str = "") -> ServeError:
    """`progress`: how far the request got, for the log."""
    message = "The client closed the request"
    return ServeError(Failure.CLIENT_GONE, f"{message} {progress}." if progress else f"{message}.")


def bad_prompt(message: str, param: str | None = None) -> ServeError:
    return ServeError(Failure.BAD_PROMPT, message, param)


def _internal_error(error: Exception) -> ServeError:
    """A bug's failure: its traceback on stderr, its name for the client."""
    traceback.print_exc(file=sys.stderr)
    return ServeError(Failure.INTERNAL, f"Internal error: {type(error).__name__}: {error}")


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
    suffix: str | None = None  # the text after the gap, for a fill-in-the-middle prompt


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Failed:
    error: ServeError


Message = Started | Delta | Answer | Failed


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
        self.tokens: list[int] | None = None  # the prompt's, once tokenised for a slot
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


@dataclass(eq=False)
class _SlotState:
    """A slot's thread and what it holds: its job, and whose KV caches it keeps."""

    index: int  # the slot's sequence in the shared context
    slot: Slot
    inbox: queue.Queue[Job | None]
    job: Job | None = None
    cache_owner: str | None = None
    last_used: int = 0  # when it last took a job (a count)


class ModelThread:
    """The model threads: one per slot, each answering one request at a time, and one that
    hands the queue's requests to idle slots in arrival order."""

    def __init__(
        self,
        slots: list[Slot],
        *,
        max_queue: int,
        history_tokens: int = 0,
    ) -> None:
        """`history_tokens`: each owner's finished prompts and answers, up to this many
        tokens, are what the drafter drafts from for that owner's requests (0: none). One
        owner's text is never drafted into another's answers, and neither is the KV cache
        one left behind reused for another (its `cached_tokens` would tell)."""
        self.history_tokens = history_tokens
        self.histories: dict[str | None, HistoryIndex] = {}
        self._histories_lock = threading.Lock()
        self.max_queue = max_queue
        self._waiting_jobs: collections.deque[Job] = collections.deque()  # see `submit`
        self._slots = [_SlotState(i, slot, queue.Queue()) for i, slot in enumerate(slots)]
        self._slot_changed = threading.Condition()
        self._handed_out = 0
        self._closed = False
        self.received = 0  # jobs accepted since the start
        self._threads = [
            threading.Thread(target=self._dispatch, name="specdec-dispatch", daemon=True),
            *(
                threading.Thread(
                    target=self._serve, args=(state,), name=f"specdec-slot-{i}", daemon=True
                )
                for i, state in enumerate(self._slots)
            ),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def slots(self) -> int:
        return len(self._slots)

    def shared_passes(self) -> dict | None:
        """How the slots' rows shared the target's passes (None with one slot)."""
        rounds = self._slots[0].slot.rounds
        if rounds is None:
            return None
        stats = rounds.stats
        return {
            "passes": stats.rounds,
            "rows": stats.rows,
            "requests_per_pass": round(stats.parts / stats.rounds, 3) if stats.rounds else 0,
            "most_requests_in_a_pass": stats.largest,
            "padding_rows": stats.padding,
            "drafter_passes": stats.drafter_rounds,
            "drafter_requests_per_pass": (
                round(stats.drafter_parts / stats.drafter_rounds, 3) if stats.drafter_rounds else 0
            ),
            "seconds_in_passes": round(stats.round_seconds, 3),
            "turns": stats.turns,
            "seconds_in_turns": round(stats.turn_seconds, 3),
        }

    @property
    def pairs(self) -> list[ModelPair]:
        """Each slot's models."""
        return [state.slot.pair for state in self._slots]

    @property
    def busy_slots(self) -> int:
        return sum(state.job is not None for state in self._slots)

    @property
    def busy(self) -> bool:
        return self.busy_slots > 0

    @property
    def queued(self) -> int:
        return len(self._waiting_jobs)

    def submit(self, job: Job) -> None:
        """Queue a job. Past --max-queue jobs that must wait for a slot, a 503 (those the
        idle slots are about to take do not count)."""
        with self._slot_changed:
            if self._closed:
                raise shutting_down()
            idle = sum(state.job is None for state in self._slots)
            if len(self._waiting_jobs) >= self.max_queue + idle:
                raise ServeError(
                    Failure.QUEUE_FULL,
                    f"The server is busy: {self.max_queue} requests are already waiting. "
                    "Retry shortly.",
                )
            self._waiting_jobs.append(job)
            self.received += 1
            self._slot_changed.notify_all()

    def stop_all(self) -> None:
        """Cancel the running jobs and every waiting one (the server is shutting down)."""
        with self._slot_changed:
            self._closed = True
            waiting, self._waiting_jobs = list(self._waiting_jobs), collections.deque()
            running = [state.job for state in self._slots if state.job is not None]
            self._slot_changed.notify_all()
        for job in running:
            job.cancel()
        for job in waiting:
            job.cancel()
            job.post(Failed(shutting_down()))

    def close(self, timeout: float = 10.0) -> None:
        self.stop_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    # -- handing out -------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hands the oldest waiting job to an idle slot, as soon as there are both; its
        prompt is tokenised here, to choose the slot."""
        while (job := self._next_job()) is not None:
            try:
                job.tokens = _tokens(self._slots[0].slot.pair.target, job.prompt)
            except ServeError as error:
                job.post(Failed(error))
                continue
            except Exception as error:  # a bug: say so, keep serving
                job.post(Failed(_internal_error(error)))
                continue
            self._slot_for(job, job.tokens).inbox.put(job)
        for state in self._slots:
            state.inbox.put(None)

    def _next_job(self) -> Job | None:
        """The oldest waiting job once a slot is idle (one whose client left gets its
        answer here); None once the server stops."""
        with self._slot_changed:
            while True:
                if self._closed:
                    return None
                if self._waiting_jobs and any(state.job is None for state in self._slots):
                    job = self._waiting_jobs.popleft()
                    if not job.cancelled:
                        return job
                    job.post(Failed(client_gone()))
                    continue
                self._slot_changed.wait()

    def _slot_for(self, job: Job, prompt: list[int]) -> _SlotState:
        """The idle slot for the job (one is idle: only this thread hands out jobs): the one
        whose cache, left by the job's owner, would serve most of its prompt, in whole
        SLOT_REUSE_BLOCKs (a resent conversation); else an empty one; else the owner's;
        else the one idle longest, whose cache is the least likely to be asked for again."""

        def preference(state: _SlotState) -> tuple[int, bool, bool, int]:
            target = state.slot.pair.target
            own = state.cache_owner == job.owner
            reused = target.prompt_reuse(prompt) // SLOT_REUSE_BLOCK if own else 0
            return reused, not target.cached, own, -state.last_used

        with self._slot_changed:
            idle = [state for state in self._slots if state.job is None]
            state = max(idle, key=preference)
            self._handed_out += 1
            state.job, state.last_used = job, self._handed_out
            return state

    # -- a slot's thread ---------------------------------------------------------------------

    def _serve(self, state: _SlotState) -> None:
        while True:
            job = state.inbox.get()
            if job is None:
                return
            clean, failure = True, None
            try:
                self._run(job, state)
            except ServeError as error:
                failure = error
            except SpecdecError as error:  # not the request's doing: it was checked before
                clean, failure = False, ServeError(_failure_of(error), str(error))
            except Exception as error:  # a bug: say so, keep serving
                clean, failure = False, _internal_error(error)
            # before the client hears back: the next job may be its
            _settle_caches(state.slot.pair, clean)
            with self._slot_changed:
                state.job = None
                self._slot_changed.notify_all()
            if failure is not None:
                job.post(Failed(failure))

    def history_of(self, owner: str | None) -> HistoryIndex | None:
        if self.history_tokens <= 0:
            return None
        with self._histories_lock:
            if owner not in self.histories:
                self.histories[owner] = HistoryIndex(self.history_tokens)
            return self.histories[owner]

    def _run(self, job: Job, state: _SlotState) -> None:
        if job.cancelled:  # its client left before a slot was free
            raise client_gone()
        pair, drafter = state.slot.pair, state.slot.drafter
        target = pair.target
        if job.owner != state.cache_owner:  # another owner's request starts from empty caches
            pair.reset()
            state.cache_owner = job.owner
        history = self.history_of(job.owner)
        use_history(drafter, history)
        prompt = job.tokens
        assert prompt is not None  # tokenised by the dispatcher, to choose this slot
        try:
            check_prompt_fits(prompt, target.n_ctx)
        except SpecdecError as error:
            param = "messages" if isinstance(job.prompt, ChatPrompt) else "prompt"
            raise ServeError(Failure.TOO_LONG, str(error), param) from None
        settings = job.settings
        _check_bias(settings.logit_bias, target.n_vocab)
        if job.prediction:  # tokenised as run does it (prompting.py)
            settings = replace(settings, prediction=prediction_tokens(target, job.prediction))
        cached = target.prompt_reuse(prompt)
        try:
            generation = Generation(
                target, prompt, settings, drafter=drafter if settings.draft_max > 0 else None
            )
        except StructureError as error:  # the grammar does not parse: before any answer
            raise bad_prompt(str(error)) from None
        job.post(Started(len(prompt), cached))
        rounds = state.slot.rounds
        with (
            rounds.taking_part(state.index) if rounds else contextlib.nullcontext(),
            stoppable(lambda: job.cancelled),  # a drafter's catch-up on the prompt too
        ):
            _prefill(target, prompt, cached, job)  # a slot's prompt decodes take its turns
            try:
                finished, logprobs = _follow(generation, job, target)
            except DecodeStopped:  # in the middle of a round
                answered = len(generation.tokens)
                raise client_gone(f"in a long decode, after {answered} answer tokens") from None
        if finished is not None and history is not None:
            with self._histories_lock:  # a resent conversation: its new part
                history.add_turn(prompt, finished.tokens)
        asked = settings.logprobs is not None
        answer = finished or generation.interrupted()
        job.post(Answer(answer, len(prompt), cached, tuple(logprobs) if asked else None))


def _check_bias(bias: tuple[tuple[int, float], ...], n_vocab: int) -> None:
    for token, _ in bias:
        if token >= n_vocab:
            raise bad_prompt(
                f"logit_bias: token {token} is not in this model's vocabulary of {n_vocab} tokens.",
                "logit_bias",
            )


def _prefill(target: Backend, prompt: list[int], cached: int, job: Job) -> None:
    """Decode the prompt but its last token PREFILL_STEP tokens at a time, at multiples of
    PREFILL_STEP from position 0 (where exact mode cuts prompts too: the cache ends as one
    decode of the prompt would leave it), checking between steps whether the client left.
    `cached`: how much of it the cache serves. The generation then decodes the rest."""
    done = cached
    for end in range((done // PREFILL_STEP + 1) * PREFILL_STEP, len(prompt), PREFILL_STEP):
        if job.cancelled:
            raise client_gone(f"during its prompt, after {done} of {len(prompt)} tokens")
        try:
            # its output is not read: choices, so a target choosing on its device stays so
            choices_for_suffix(target, prompt[:end], 1, prompt=True)
        except DecodeStopped:  # between two chunks of this step
            read = len(target.cached)
            raise client_gone(f"during its prompt, after {read} of {len(prompt)} tokens") from None
        done = end


def _follow(
    generation: Generation, job: Job, target: Backend
) -> tuple[Finished | None, list[TokenLogprobs]]:
    """Post the generation's text to the job, each piece with the logprobs of the tokens
    since the last (a token whose text is held back, as a stop string's start, goes with
    the next); how it finished (None: the client left) and every token's logprobs."""
    logprobs: list[TokenLogprobs] = []
    sent = 0
    events = generation.events()
    try:
        for event in events:
            if job.cancelled:  # the client went away: stop here, between two rounds
                return None, logprobs
            if isinstance(event, Piece):
                if event.logprob is not None:
                    logprobs.append(_spelled(target, event.logprob))
                if event.text:
                    job.post(Delta(event.text, tuple(logprobs[sent:])))
                    sent = len(logprobs)
            elif isinstance(event, Finished):
                if sent < len(logprobs):  # tokens whose text a stop string cut
                    job.post(Delta("", tuple(logprobs[sent:])))
                return event, logprobs
    finally:
        events.close()
    return None, logprobs


def _spelled(target: Backend, logprob: TokenLogprob) -> TokenLogprobs:
    """With each token spelled as the vocabulary spells it (control tokens too)."""
    top = tuple((target.token_spelling(token), value) for token, value in logprob.top)
    return TokenLogprobs(target.token_spelling(logprob.token), logprob.logprob, top)


def _tokens(target: Backend, prompt: ChatPrompt | TextPrompt) -> list[int]:
    if isinstance(prompt, TextPrompt) and prompt.suffix:
        try:
            tokens = fill_in_middle_tokens(target, prompt.text, prompt.suffix)
        except ModelFileError as error:
            said = str(error)  # the command line's sentence, as a sentence of its own
            raise bad_prompt(said[0].upper() + said[1:], "suffix") from None
    elif isinstance(prompt, TextPrompt):
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


def _settle_caches(pair: ModelPair, clean: bool) -> None:
    """Leave both KV caches matching their token lists. After a clean end they already
    do (this drops nothing); after an error in the middle of a decode, start over."""
    for backend in (pair.target, pair.drafter):
        if backend is not None:
            try:
                backend.truncate(len(backend.cached) if clean else 0)
            except RuntimeError:  # llama.cpp refused a partial removal: clear it all
                backend.truncate(0)
