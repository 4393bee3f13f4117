"""`specdec serve --parallel N` on the tiny GGUF pair: several clients at once, each answer
the one `specdec run` gives alone (greedy and seeded), their tokens sharing the target's
passes; and what must stay true with several slots: a client that leaves frees its slot
while the others go on, a full queue is a 503, a prompt too long for a slot is a 400, and
a slot whose generation fails takes nobody else's answer with it.

The exactness of the shared passes themselves, logits bit for bit with a control that
can see a difference, is tests/test_parallel.py's."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest
from serve_process import ServerProcess, health, run_json, wait_for_health
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.library import PROMPT_CHUNK
from specdec_cli.models.loading import ModelPair
from specdec_cli.serve import model_thread
from specdec_cli.serve.model_thread import Failed, Failure, Job, ModelThread, TextPrompt
from specdec_cli.serve.responses import Answer
from specdec_cli.services.lifecycle import Slot

CTX = 2048  # each slot's
LONG_PROMPT = "hello"  # raw, greedy: the endless target goes on to the end of the context
# as long an answer as a slot's context holds (a longer max_tokens is a 400, as OpenAI's)
LONG_ANSWER = CTX - 16
QUESTIONS = ["the cat sat on", "what is the time", "one two three", "a b c d e f"]
ANSWER_TOKENS = 300  # long enough that four answers sent at once are made side by side


def models_of(tiny_models) -> tuple[str, ...]:
    return ("--target", str(tiny_models.endless_target), "--draft", str(tiny_models.close_drafter))


def same_settings(tiny_models) -> tuple[str, ...]:
    return (*models_of(tiny_models), "--drafter", "fixed", "--threads", "1")


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    process = ServerProcess(
        *same_settings(tiny_models),
        *("--parallel", "4", "--ctx-size", str(CTX), "--json-log"),
        home=tmp_path_factory.mktemp("serve-home"),
    )
    yield process
    assert process.stop() == 0, "\n".join(process.lines)


@pytest.mark.parametrize(
    "sampling, run_flags",
    [({"temperature": 0}, ()), ({"temperature": 0.9, "seed": 5}, ("--temp", "0.9", "--seed", "5"))],
    ids=["greedy", "seeded"],
)
def test_four_clients_at_once_get_the_answers_each_gets_alone(
    server, tiny_models, sampling, run_flags
):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    before = health(server)["shared_passes"]
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        response = client.chat.completions.create(
            model="target",
            messages=[{"role": "user", "content": QUESTIONS[i]}],
            max_tokens=ANSWER_TOKENS,
            **sampling,
        )
        answers[i] = response.choices[0].message.content or ""

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(QUESTIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = health(server)["shared_passes"]
    assert after["most_requests_in_a_pass"] >= 2  # they really shared passes
    assert after["rows"] - before["rows"] > after["passes"] - before["passes"]

    for i, question in enumerate(QUESTIONS):
        alone = run_json(
            question,
            *same_settings(tiny_models),
            "--ctx-size",
            str(CTX),
            "-n",
            str(ANSWER_TOKENS),
            *run_flags,
        )
        assert answers[i] == alone["text"], question


def stream_lines(server, body: dict, into: list[str], started: threading.Event, stop):
    """Stream a completion into `into` until `stop()` says to leave (or it ends)."""
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                into.append(line)
                started.set()
            if stop():
                return


def test_clients_that_leave_free_their_slots_while_the_others_go_on(server):
    body = {"prompt": LONG_PROMPT, "max_tokens": LONG_ANSWER, "stream": True}
    leave = [threading.Event() for _ in range(4)]
    started = [threading.Event() for _ in range(4)]
    received: list[list[str]] = [[] for _ in range(4)]
    threads = [
        threading.Thread(
            target=stream_lines,
            args=(server, body, received[i], started[i], leave[i].is_set),
        )
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    try:
        assert all(event.wait(120) for event in started)
        wait_for_health(server, lambda h: h["busy_slots"] == 4)
        leave[0].set()
        leave[1].set()
        threads[0].join(60)
        threads[1].join(60)
        state = wait_for_health(server, lambda h: h["busy_slots"] == 2)
        assert state["queued"] == 0
        going_on = len(received[2])
        wait_for_health(server, lambda h: len(received[2]) > going_on + 10)  # still streaming
        assert health(server)["busy_slots"] == 2
    finally:
        for event in leave:
            event.set()
        for thread in threads:
            thread.join(60)
    wait_for_health(server, lambda h: h["busy_slots"] == 0)
    left = [r for r in server.log() if r.get("finish_reason") == "interrupted"]
    assert len(left) >= 4 and all(r["status"] == 499 for r in left)
    # and the server answers as before
    answer = httpx.post(
        server.url + "/v1/completions", json={"prompt": "the cat", "max_tokens": 8}, timeout=60
    ).json()
    assert answer["usage"]["completion_tokens"] == 8


def test_a_prompt_too_long_for_a_slot_is_a_400_and_the_other_answers_go_on(server):
    leave, started, received = threading.Event(), threading.Event(), []
    body = {"prompt": LONG_PROMPT, "max_tokens": LONG_ANSWER, "stream": True}
    streaming = threading.Thread(
        target=stream_lines, args=(server, body, received, started, leave.is_set)
    )
    streaming.start()
    try:
        assert started.wait(120)
        too_long = "the cat sat on the mat " * 2 * CTX  # over one slot's context, not four
        response = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": too_long, "max_tokens": 4},
            timeout=120,
        )
        assert response.status_code == 400, response.text
        assert "context" in response.json()["error"]["message"]
        going_on = len(received)
        wait_for_health(server, lambda h: len(received) > going_on + 10)
    finally:
        leave.set()
        streaming.join(60)


def test_a_full_queue_is_a_503_with_every_slot_busy(tiny_models, tmp_path):
    server = ServerProcess(
        *("--target", str(tiny_models.endless_target), "--no-draft", "--parallel", "2"),
        *("--max-queue", "1", "--threads", "1"),
        *("--ctx-size", str(CTX)),
        home=tmp_path,
    )
    body = {"prompt": LONG_PROMPT, "max_tokens": LONG_ANSWER, "stream": True}
    leave = threading.Event()
    started = [threading.Event() for _ in range(3)]
    received: list[list[str]] = [[] for _ in range(3)]
    threads = [
        threading.Thread(
            target=stream_lines, args=(server, body, received[i], started[i], leave.is_set)
        )
        for i in range(3)
    ]
    try:
        threads[0].start()
        threads[1].start()
        assert started[0].wait(120) and started[1].wait(120)
        wait_for_health(server, lambda h: h["busy_slots"] == 2)
        threads[2].start()  # waits in the queue
        wait_for_health(server, lambda h: h["queued"] == 1)
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert refused.status_code == 503
        assert refused.json()["error"]["type"]
        leave.set()  # the two leave: the queued one gets a slot
        assert started[2].wait(120)
    finally:
        leave.set()
        for thread in threads:
            if thread.is_alive() or thread.ident is not None:
                thread.join(60)
        assert server.stop() == 0, "\n".join(server.lines)


# ---- in process: a slot that fails ----------------------------------------------------------


def run_jobs(models: ModelThread, prompts: list[str], settings: GenerationSettings) -> list:
    """Every prompt at once; the last message each job got."""

    async def one(prompt: str):
        job = Job(TextPrompt(prompt), settings, None, asyncio.get_running_loop())
        models.submit(job)
        message = await job.next()
        while not isinstance(message, Answer | Failed):
            message = await job.next()
        return message

    async def everyone():
        return await asyncio.gather(*(one(prompt) for prompt in prompts))

    return asyncio.run(everyone())


def slots_thread(tiny_models, n: int) -> tuple[LlamaBackend, ModelThread]:
    """The tiny target split into `n` slots (no drafter), their model threads started."""
    owner = LlamaBackend(tiny_models.target, n_ctx=CTX, n_threads=1, exact=True)
    slots = [Slot(ModelPair(view, None), None, view.rounds) for view in owner.split(n)]
    models = ModelThread(slots, max_queue=4)
    models.start()
    return owner, models


def test_a_slot_whose_generation_fails_leaves_the_others_answers_whole(tiny_models, monkeypatch):
    owner, models = slots_thread(tiny_models, 2)
    settings = GenerationSettings(max_tokens=200)

    class FailingForOnePrompt(Generation):
        def events(self):
            for n, event in enumerate(super().events()):
                if n == 20 and self.prompt[-1] == failing_token:
                    raise RuntimeError("a bug in the middle of one answer")
                yield event

    try:
        alone = run_jobs(models, ["the cat sat on"], settings)[0]
        failing_token = models.pairs[0].target.tokenize("one two three", add_special=True)[-1]
        monkeypatch.setattr(model_thread, "Generation", FailingForOnePrompt)
        failed, answered = run_jobs(models, ["one two three", "the cat sat on"], settings)
        assert isinstance(failed, Failed) and failed.error.failure is Failure.INTERNAL
        assert isinstance(answered, Answer)
        assert answered.finished.text == alone.finished.text
        monkeypatch.setattr(model_thread, "Generation", Generation)
        again = run_jobs(models, ["one two three", "the cat sat on"], settings)
        assert all(isinstance(message, Answer) for message in again)
    finally:
        models.close()
        owner.close()


# ---- the real pair --------------------------------------------------------------------------

REAL_QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What does HTTP status 404 mean? One sentence.",
    "Give a JSON object with keys name and age for a 30-year-old called Ada.",
    "Name three sorting algorithms.",
]


@pytest.mark.slow
def test_four_clients_at_once_on_the_real_pair_get_their_specdec_run_answers(
    shared_model_cache,
):
    """The default pair (SmolLM2 drafting for Qwen by text, combined mode), four slots:
    greedy and seeded answers equal `specdec run`'s, each alone."""
    from specdec_cli.models.resolve import resolve_model

    models = ("--target", str(resolve_model("large").path), "--draft", "tiny")
    settings = ("--ctx-size", "2048", "-n", "48")
    server = ServerProcess(*models, *settings, "--parallel", "4", home=None)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        for sampling, run_flags in (
            ({"temperature": 0}, ()),
            ({"temperature": 0.8, "seed": 3}, ("--temp", "0.8", "--seed", "3")),
        ):
            answers: dict[int, str] = {}

            def ask(i: int, sampling: dict = sampling, answers: dict = answers) -> None:
                response = client.chat.completions.create(
                    model="large",
                    messages=[{"role": "user", "content": REAL_QUESTIONS[i]}],
                    **sampling,
                )
                answers[i] = response.choices[0].message.content or ""

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert health(server)["shared_passes"]["most_requests_in_a_pass"] >= 2
            for i, question in enumerate(REAL_QUESTIONS):
                alone = run_json(question, *models, *settings, *run_flags)
                assert answers[i] == alone["text"], question
    finally:
        assert server.stop() == 0, "\n".join(server.lines)


def test_parallel_with_rpc_workers_and_out_of_range_are_refused(tiny_models):
    models = ("--target", str(tiny_models.target), "--no-draft")
    result = CliRunner().invoke(app, ["serve", *models, "--parallel", "2", "--rpc", "10.0.0.2:1"])
    assert result.exit_code == 1 and "--parallel with --rpc" in result.output
    result = CliRunner().invoke(app, ["serve", *models, "-np", "9"])
    assert result.exit_code == 2 and "--parallel" in result.output


def test_a_resent_conversation_goes_to_the_slot_that_holds_its_prefix(tiny_models):
    owner, models = slots_thread(tiny_models, 3)
    settings = GenerationSettings(max_tokens=8)
    conversation = "the cat sat on the mat " * 60  # several whole prompt chunks

    async def started_of(prompt: str):
        job = Job(TextPrompt(prompt), settings, None, asyncio.get_running_loop())
        models.submit(job)
        first = await job.next()
        message = first
        while not isinstance(message, Answer | Failed):
            message = await job.next()
        return first

    try:
        for prompt in ("one two three", conversation, "a b c d e f"):  # a slot each
            run_jobs(models, [prompt], settings)
        # Neither the slot used last nor the one idle longest: the conversation's.
        resent = asyncio.run(started_of(conversation + " and then"))
        assert resent.cached_tokens >= PROMPT_CHUNK
    finally:
        models.close()
        owner.close()
