"""The server's worker thread on the tiny GGUF target, in process: what it posts, what
reaches the engine, and caches left consistent when a generation fails."""

from __future__ import annotations

import asyncio

import jinja2
import pytest

from specdec_cli.decoding.adaptive import CostModel, build_drafter
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.history import DEFAULT_HISTORY_TOKENS
from specdec_cli.models.loading import load_pair
from specdec_cli.request import HardwareOptions
from specdec_cli.serve import serve_worker
from specdec_cli.serve.serve_protocol import Answer
from specdec_cli.serve.serve_worker import (
    ChatPrompt,
    Failed,
    Failure,
    Job,
    Started,
    TextPrompt,
    Worker,
    WorkerError,
)


@pytest.fixture
def worker(tiny_models):
    pair = load_pair(
        tiny_models.target, tiny_models.close_drafter, HardwareOptions(ctx_size=512, threads=1)
    )
    worker = Worker(pair, None, max_queue=4)
    worker.start()
    yield worker
    worker.close()


def run_job(
    worker: Worker, prompt, settings: GenerationSettings, prediction=None, owner=None
) -> list:
    async def go() -> list:
        job = Job(prompt, settings, prediction, asyncio.get_running_loop(), owner)
        worker.submit(job)
        messages = [await job.next()]
        while not isinstance(messages[-1], Answer | Failed):
            messages.append(await job.next())
        return messages

    return asyncio.run(go())


def test_started_then_text_then_the_answer(worker):
    messages = run_job(worker, TextPrompt("the cat"), GenerationSettings(max_tokens=12))
    started, *texts, answer = messages
    assert isinstance(started, Started) and started.prompt_tokens > 1
    assert isinstance(answer, Answer)
    assert "".join(texts) == answer.finished.text
    assert answer.finished.stats.generated == 12


def test_the_prediction_reaches_the_engine_as_target_tokens(worker, monkeypatch):
    seen: list[GenerationSettings] = []

    class Recording(Generation):
        def __init__(self, target, prompt, settings, **kwargs) -> None:
            seen.append(settings)
            super().__init__(target, prompt, settings, **kwargs)

    monkeypatch.setattr(serve_worker, "Generation", Recording)
    run_job(worker, TextPrompt("the cat"), GenerationSettings(max_tokens=4), "sat on the mat")
    expected = worker.pair.target.tokenize("sat on the mat", add_special=False)
    assert seen[0].prediction == tuple(expected) and expected


def test_a_failing_generation_is_a_500_and_leaves_the_caches_consistent(worker, monkeypatch):
    prompt = ChatPrompt([{"role": "user", "content": "the cat sat on"}])
    settings = GenerationSettings(max_tokens=16)
    before = run_job(worker, prompt, settings)[-1].finished.text

    class Failing(Generation):
        def events(self):
            for n, event in enumerate(super().events()):
                if n == 3:
                    raise RuntimeError("a bug in the middle of an answer")
                yield event

    monkeypatch.setattr(serve_worker, "Generation", Failing)
    failed = run_job(worker, prompt, settings)[-1]
    assert isinstance(failed, Failed) and failed.error.failure is Failure.INTERNAL
    for backend in (worker.pair.target, worker.pair.drafter):
        assert backend.cached == []  # started over rather than trusting a half-done decode

    monkeypatch.setattr(serve_worker, "Generation", Generation)
    assert run_job(worker, prompt, settings)[-1].finished.text == before


def test_a_template_that_refuses_the_messages_is_a_400(worker, monkeypatch):
    def refuse(messages):
        raise jinja2.TemplateError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(worker.pair.target, "format_chat", refuse)
    prompt = ChatPrompt([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    failed = run_job(worker, prompt, GenerationSettings(max_tokens=4))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.failure is Failure.BAD_PROMPT and "alternate" in failed.error.message
    answer = run_job(worker, TextPrompt("the cat"), GenerationSettings(max_tokens=4))[-1]
    assert isinstance(answer, Answer)


def drafting_worker(tiny_models, history_tokens: int) -> Worker:
    pair = load_pair(tiny_models.target, None, HardwareOptions(ctx_size=512, threads=1))
    # Verification priced as free: every match worth drafting is drafted.
    costs = CostModel({1: 1.0, 64: 1.0}, 0.0, learn=False)
    drafter = build_drafter("ngram", pair.target, None, costs)
    worker = Worker(pair, drafter, max_queue=4, history_tokens=history_tokens)
    worker.start()
    return worker


def test_a_repeated_request_drafts_from_the_history_and_answers_the_same(tiny_models):
    prompt, settings = TextPrompt("the cat sat on"), GenerationSettings(max_tokens=24)
    answers = {}
    for label, history_tokens in (("kept", DEFAULT_HISTORY_TOKENS), ("none", 0)):
        worker = drafting_worker(tiny_models, history_tokens)
        try:
            answers[label] = [run_job(worker, prompt, settings)[-1].finished for _ in range(2)]
        finally:
            worker.close()
    kept, none = answers["kept"], answers["none"]
    assert [f.tokens for f in kept] == [f.tokens for f in none]
    assert kept[1].stats.draft_sources["history"] > 0
    assert kept[0].stats.draft_sources["history"] == 0  # nothing before the first request
    assert none[1].stats.draft_sources["history"] == 0


def test_each_api_key_drafts_only_from_its_own_history(tiny_models):
    """Client 2 asks what client 1 asked: its answer is the same, but nothing of client 1's
    answer is drafted into it; its own repeat is."""
    prompt, settings = TextPrompt("the cat sat on"), GenerationSettings(max_tokens=24)
    worker = drafting_worker(tiny_models, DEFAULT_HISTORY_TOKENS)
    try:
        first = [run_job(worker, prompt, settings, owner="key 1")[-1] for _ in range(2)]
        other = [run_job(worker, prompt, settings, owner="key 2")[-1] for _ in range(2)]
    finally:
        worker.close()
    assert first[1].finished.stats.draft_sources["history"] > 0
    assert other[0].finished.stats.draft_sources["history"] == 0  # key 1's text stays key 1's
    assert other[1].finished.stats.draft_sources["history"] > 0
    assert len({answer.finished.text for answer in first + other}) == 1
    assert set(worker.histories) == {"key 1", "key 2"}
    assert [len(worker.histories[key]) for key in ("key 1", "key 2")] == [2, 2]


def test_another_keys_request_does_not_reuse_the_kv_cache_one_left(tiny_models):
    """`cached_tokens` would tell client 2 what client 1's prompt began with."""
    prompt = TextPrompt("the cat sat on the mat " * 30)  # whole prompt chunks to reuse
    settings = GenerationSettings(max_tokens=4)
    worker = drafting_worker(tiny_models, 0)
    try:
        owners = ["key 1", "key 1", "key 2", "key 1", None]
        started = [run_job(worker, prompt, settings, owner=owner)[0] for owner in owners]
    finally:
        worker.close()
    cached = [message.cached_tokens for message in started]
    assert cached[0] == 0 and cached[1] > 0  # the same client reuses its own prefix
    assert cached[2:] == [0, 0, 0]


def test_the_server_says_each_failure_in_http():
    """The worker reports what went wrong; server.py alone knows HTTP."""
    from specdec_cli.serve.server import api_error

    expected = {
        Failure.BAD_PROMPT: (400, None),
        Failure.TOO_LONG: (400, "context_length_exceeded"),
        Failure.QUEUE_FULL: (503, "queue_full"),
        Failure.SHUTTING_DOWN: (503, None),
        Failure.CLIENT_GONE: (499, None),
        Failure.INTERNAL: (500, None),
    }
    assert set(expected) == set(Failure)
    for failure, (status, code) in expected.items():
        error = api_error(WorkerError(failure, "why", "messages"))
        assert (error.status, error.code, error.message) == (status, code, "why"), failure
    assert api_error(WorkerError(Failure.QUEUE_FULL, "busy")).headers == {"Retry-After": "1"}
    assert api_error(WorkerError(Failure.TOO_LONG, "long", "prompt")).param == "prompt"


def test_a_prompt_too_long_is_reported_with_the_field_at_fault(worker):
    long_text = "the cat sat on the mat " * 200
    failed = run_job(worker, TextPrompt(long_text), GenerationSettings(max_tokens=4))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.failure is Failure.TOO_LONG and failed.error.param == "prompt"
