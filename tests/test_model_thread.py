"""The server's models thread on the tiny GGUF target, in process: what it posts, what
reaches the engine, and caches left consistent when a generation fails."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.history import DEFAULT_HISTORY_TOKENS
from specdec_cli.decoding.modes import build_drafter
from specdec_cli.errors import ChatTemplateError, ContextOverflowError, DecodeError, SpecdecError
from specdec_cli.llama import rpc
from specdec_cli.models.loading import load_pair
from specdec_cli.request import HardwareOptions
from specdec_cli.serve import model_thread
from specdec_cli.serve.model_thread import (
    ChatPrompt,
    Failed,
    Failure,
    Job,
    ModelThread,
    ServeError,
    Started,
    TextPrompt,
)
from specdec_cli.serve.responses import Answer, Delta
from specdec_cli.services.lifecycle import Slot


@pytest.fixture
def models(tiny_models):
    pair = load_pair(
        tiny_models.target, tiny_models.close_drafter, HardwareOptions(ctx_size=512, threads=1)
    )
    models = ModelThread([Slot(pair, None, None)], max_queue=4)
    models.start()
    yield models
    models.close()


def run_job(
    models: ModelThread, prompt, settings: GenerationSettings, prediction=None, owner=None
) -> list:
    async def go() -> list:
        job = Job(prompt, settings, prediction, asyncio.get_running_loop(), owner)
        models.submit(job)
        messages = [await job.next()]
        while not isinstance(messages[-1], Answer | Failed):
            messages.append(await job.next())
        return messages

    return asyncio.run(go())


def test_started_then_text_then_the_answer(models):
    messages = run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=12))
    started, *texts, answer = messages
    assert isinstance(started, Started) and started.prompt_tokens > 1
    assert isinstance(answer, Answer)
    assert "".join(delta.text for delta in texts) == answer.finished.text
    assert answer.logprobs is None and all(delta.logprobs == () for delta in texts)
    assert answer.finished.stats.generated == 12


def test_the_prediction_reaches_the_engine_as_target_tokens(models, monkeypatch):
    seen: list[GenerationSettings] = []

    class Recording(Generation):
        def __init__(self, target, prompt, settings, **kwargs) -> None:
            seen.append(settings)
            super().__init__(target, prompt, settings, **kwargs)

    monkeypatch.setattr(model_thread, "Generation", Recording)
    run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=4), "sat on the mat")
    expected = models.pairs[0].target.tokenize("sat on the mat", add_special=False)
    assert seen[0].prediction == tuple(expected) and expected


def test_a_failing_generation_is_a_500_and_leaves_the_caches_consistent(models, monkeypatch):
    prompt = ChatPrompt([{"role": "user", "content": "the cat sat on"}])
    settings = GenerationSettings(max_tokens=16)
    before = run_job(models, prompt, settings)[-1].finished.text

    class Failing(Generation):
        def events(self):
            for n, event in enumerate(super().events()):
                if n == 3:
                    raise RuntimeError("a bug in the middle of an answer")
                yield event

    monkeypatch.setattr(model_thread, "Generation", Failing)
    failed = run_job(models, prompt, settings)[-1]
    assert isinstance(failed, Failed) and failed.error.failure is Failure.INTERNAL
    for backend in (models.pairs[0].target, models.pairs[0].drafter):
        assert backend.cached == []  # started over rather than trusting a half-done decode

    monkeypatch.setattr(model_thread, "Generation", Generation)
    assert run_job(models, prompt, settings)[-1].finished.text == before


@pytest.mark.parametrize(
    "error, failure",
    [
        (DecodeError("llama_decode returned -1."), Failure.DECODE_FAILED),
        (rpc.WorkerError("the worker at 10.0.0.2:50052 stopped answering."), Failure.UNAVAILABLE),
        (ContextOverflowError("the context is full."), Failure.TOO_LONG),
        (SpecdecError("the disk is full."), Failure.INTERNAL),
    ],
)
def test_each_failure_in_a_generation_is_reported_as_what_it_is(
    models, monkeypatch, error, failure
):
    # None of them is the request's doing (a 400 "bad prompt" would tell the client to change it).
    class Failing(Generation):
        def events(self):
            for n, event in enumerate(super().events()):
                if n == 2:
                    raise error
                yield event

    monkeypatch.setattr(model_thread, "Generation", Failing)
    failed = run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=8))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.failure is failure and failed.error.message == str(error)
    assert models.pairs[0].target.cached == []  # started over, as after any failure mid-decode


def test_a_template_that_refuses_the_messages_is_a_400(models, monkeypatch):
    def refuse(messages, tools=None):
        raise ChatTemplateError("The template says: roles must alternate user/assistant.")

    monkeypatch.setattr(models.pairs[0].target, "format_chat", refuse)
    prompt = ChatPrompt([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    failed = run_job(models, prompt, GenerationSettings(max_tokens=4))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.failure is Failure.BAD_PROMPT and "alternate" in failed.error.message
    answer = run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=4))[-1]
    assert isinstance(answer, Answer)


def drafting_thread(tiny_models, history_tokens: int) -> ModelThread:
    pair = load_pair(tiny_models.target, None, HardwareOptions(ctx_size=512, threads=1))
    # Verification priced as free: every match worth drafting is drafted.
    costs = CostModel({1: 1.0, 64: 1.0}, 0.0, learn=False)
    drafter = build_drafter("ngram", pair.target, None, costs)
    models = ModelThread([Slot(pair, drafter, None)], max_queue=4, history_tokens=history_tokens)
    models.start()
    return models


def test_a_repeated_request_drafts_from_the_history_and_answers_the_same(tiny_models):
    prompt, settings = TextPrompt("the cat sat on"), GenerationSettings(max_tokens=24)
    answers = {}
    for label, history_tokens in (("kept", DEFAULT_HISTORY_TOKENS), ("none", 0)):
        models = drafting_thread(tiny_models, history_tokens)
        try:
            answers[label] = [run_job(models, prompt, settings)[-1].finished for _ in range(2)]
        finally:
            models.close()
    kept, none = answers["kept"], answers["none"]
    assert [f.tokens for f in kept] == [f.tokens for f in none]
    assert kept[1].stats.draft_sources["history"] > 0
    assert kept[0].stats.draft_sources["history"] == 0  # nothing before the first request
    assert none[1].stats.draft_sources["history"] == 0


def test_each_api_key_drafts_only_from_its_own_history(tiny_models):
    """Client 2 asks what client 1 asked: its answer is the same, but nothing of client 1's
    answer is drafted into it; its own repeat is."""
    prompt, settings = TextPrompt("the cat sat on"), GenerationSettings(max_tokens=24)
    models = drafting_thread(tiny_models, DEFAULT_HISTORY_TOKENS)
    try:
        first = [run_job(models, prompt, settings, owner="key 1")[-1] for _ in range(2)]
        other = [run_job(models, prompt, settings, owner="key 2")[-1] for _ in range(2)]
    finally:
        models.close()
    assert first[1].finished.stats.draft_sources["history"] > 0
    assert other[0].finished.stats.draft_sources["history"] == 0  # key 1's text stays key 1's
    assert other[1].finished.stats.draft_sources["history"] > 0
    assert len({answer.finished.text for answer in first + other}) == 1
    assert set(models.histories) == {"key 1", "key 2"}
    assert [len(models.histories[key]) for key in ("key 1", "key 2")] == [2, 2]


def test_a_conversation_resent_whole_is_stored_once_turn_by_turn(tiny_models):
    # A chat client resends every earlier turn with each request: the history keeps each
    # turn once (what the prompt shares with the last turn is stored already), not the
    # whole conversation again each time (about five times the conversation after ten).
    max_tokens = 8
    models = drafting_thread(tiny_models, DEFAULT_HISTORY_TOKENS)
    messages: list[dict[str, str]] = []
    answers = []
    try:
        for turn in range(10):
            messages.append({"role": "user", "content": f"tell me about the number {turn}"})
            answer = run_job(models, ChatPrompt(list(messages)), GenerationSettings(max_tokens=8))
            answers.append(answer[-1])
            messages.append({"role": "assistant", "content": answer[-1].finished.text})
    finally:
        models.close()
    stored = models.histories[None].tokens
    conversation = answers[-1].prompt_tokens + len(answers[-1].finished.tokens)
    every_answer = sum(len(answer.finished.tokens) for answer in answers)
    # At most an answer's worth more per turn: a resent answer may tokenise otherwise.
    assert every_answer <= stored <= conversation + 10 * max_tokens


def test_another_keys_request_does_not_reuse_the_kv_cache_one_left(tiny_models):
    """`cached_tokens` would tell client 2 what client 1's prompt began with."""
    prompt = TextPrompt("the cat sat on the mat " * 30)  # whole prompt chunks to reuse
    settings = GenerationSettings(max_tokens=4)
    models = drafting_thread(tiny_models, 0)
    try:
        owners = ["key 1", "key 1", "key 2", "key 1", None]
        started = [run_job(models, prompt, settings, owner=owner)[0] for owner in owners]
    finally:
        models.close()
    cached = [message.cached_tokens for message in started]
    assert cached[0] == 0 and cached[1] > 0  # the same client reuses its own prefix
    assert cached[2:] == [0, 0, 0]


def test_the_server_says_each_failure_in_http():
    """The model thread reports what went wrong; server.py alone knows HTTP."""
    from specdec_cli.serve.server import api_error

    expected = {
        Failure.BAD_PROMPT: (400, None),
        Failure.TOO_LONG: (400, "context_length_exceeded"),
        Failure.QUEUE_FULL: (503, "queue_full"),
        Failure.SHUTTING_DOWN: (503, None),
        Failure.CLIENT_GONE: (499, None),
        Failure.DECODE_FAILED: (500, "decode_failed"),
        Failure.UNAVAILABLE: (503, "backend_unavailable"),
        Failure.INTERNAL: (500, None),
    }
    assert set(expected) == set(Failure)
    for failure, (status, code) in expected.items():
        error = api_error(ServeError(failure, "why", "messages"))
        assert (error.status, error.code, error.message) == (status, code, "why"), failure
    assert api_error(ServeError(Failure.QUEUE_FULL, "busy")).headers == {"Retry-After": "1"}
    assert api_error(ServeError(Failure.TOO_LONG, "long", "prompt")).param == "prompt"


def test_a_prompt_too_long_is_reported_with_the_field_at_fault(models):
    long_text = "the cat sat on the mat " * 200
    failed = run_job(models, TextPrompt(long_text), GenerationSettings(max_tokens=4))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.failure is Failure.TOO_LONG and failed.error.param == "prompt"


class BlockingPrompt:
    """Wraps a target's decode: each prompt decode says it started and waits to be let go
    (never a sleep), so a test can act while a long prompt is being read."""

    def __init__(self, target) -> None:
        self.decode = target.decode
        self.started = threading.Event()
        self.go = threading.Event()
        self.steps: list[int] = []
        target.decode = self

    def __call__(self, tokens, n_logit_rows, prompt=False):
        if prompt:
            self.steps.append(len(tokens))
            self.started.set()
            assert self.go.wait(timeout=120), "the test never let the prompt go on"
        return self.decode(tokens, n_logit_rows, prompt)


class BlockingChunks:
    """Wraps a backend's chunk decodes: each says it started and waits to be let go."""

    def __init__(self, backend) -> None:
        self.decode_chunk = backend._decode_chunk
        self.started = threading.Event()
        self.go = threading.Event()
        self.chunks: list[int] = []
        backend._decode_chunk = self

    def __call__(self, chunk, n_logit_rows, invariant):
        self.chunks.append(len(chunk))
        self.started.set()
        assert self.go.wait(timeout=120), "the test never let the decode go on"
        return self.decode_chunk(chunk, n_logit_rows, invariant)


def test_a_client_that_leaves_while_the_drafter_reads_the_prompt_frees_the_slot(tiny_models):
    """The drafter catches up on a long prompt in one call (its first draft): the request
    stops within one of that call's chunks, not after all of them."""
    hardware = HardwareOptions(ctx_size=2048, threads=1)
    pair = load_pair(tiny_models.target, tiny_models.close_drafter, hardware)
    assert pair.drafter is not None
    blocking = BlockingChunks(pair.drafter)
    drafter = build_drafter("fixed", pair.target, pair.drafter)
    models = ModelThread([Slot(pair, drafter, None)], max_queue=4)
    models.start()
    long_prompt = TextPrompt("the cat sat on the mat and then it went away " * 80)
    settings = GenerationSettings(max_tokens=4, draft_max=4)

    async def leave_while_drafting() -> Failed:
        loop = asyncio.get_running_loop()
        job = Job(long_prompt, settings, None, loop, None)
        models.submit(job)
        assert isinstance(await job.next(), Started)
        await loop.run_in_executor(None, blocking.started.wait)
        job.cancel()
        blocking.go.set()
        last = await job.next()
        while isinstance(last, Delta):  # text of the target's first token, maybe
            last = await job.next()
        assert isinstance(last, Failed)
        return last

    try:
        failed = asyncio.run(leave_while_drafting())
        assert failed.error.failure is Failure.CLIENT_GONE
        n_prompt = len(pair.drafter.tokenize(long_prompt.text, add_special=True))
        assert n_prompt > 2 * pair.drafter.n_batch
        assert len(blocking.chunks) == 1  # one chunk of several, not the whole prompt
        assert "in a long decode, after" in failed.error.message
        messages = run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=4))
        assert isinstance(messages[-1], Answer)  # the slot is free for the next request
    finally:
        blocking.go.set()
        models.close()


def test_a_client_that_leaves_during_its_prompt_frees_the_slot_within_one_step(tiny_models):
    pair = load_pair(tiny_models.target, None, HardwareOptions(ctx_size=512, threads=1))
    blocking = BlockingPrompt(pair.target)
    models = ModelThread([Slot(pair, None, None)], max_queue=4)
    models.start()
    long_prompt = TextPrompt("the cat sat on the mat and then it went away " * 20)

    async def leave_during_the_prompt() -> Failed:
        loop = asyncio.get_running_loop()
        job = Job(long_prompt, GenerationSettings(max_tokens=4), None, loop, None)
        models.submit(job)
        assert isinstance(await job.next(), Started)
        await loop.run_in_executor(None, blocking.started.wait)
        job.cancel()  # what a disconnect does
        blocking.go.set()
        failed = await job.next()
        assert isinstance(failed, Failed)
        return failed

    try:
        failed = asyncio.run(leave_during_the_prompt())
        assert failed.error.failure is Failure.CLIENT_GONE
        n_prompt = len(pair.target.tokenize(long_prompt.text, add_special=True))
        assert n_prompt > 2 * model_thread.PREFILL_STEP
        assert blocking.steps == [model_thread.PREFILL_STEP]  # one step, not the whole prompt
        read = re.search(rf"after (\d+) of {n_prompt} tokens", failed.error.message)
        assert read is not None and 0 < int(read[1]) <= model_thread.PREFILL_STEP
        messages = run_job(models, TextPrompt("the cat"), GenerationSettings(max_tokens=4))
        assert isinstance(messages[-1], Answer)  # the slot is free for the next request
    finally:
        blocking.go.set()
        models.close()
