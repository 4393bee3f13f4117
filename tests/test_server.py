"""`specdec serve` as a real process on 127.0.0.1, on the tiny GGUF pair: the official
`openai` client, raw HTTP for what a client library would not send, 8 clients at once,
a client that disconnects mid-stream, and greedy identity with `specdec run`."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from prompt_reuse import assert_exact_reuse
from serve_process import ServerProcess, run_json, wait_for_health
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.llama.library import PROMPT_CHUNK

KEY = "test-key"
SECOND_KEY = "another-client"  # a second --api-key: its own history, its own caches
CTX = 32768
# The servers' target is the endless one: its answers run to max_tokens
LONG_PROMPT = "hello"
LONG_CHAT = "one two three four"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-home")
    process = ServerProcess(
        *("--target", str(tiny_models.endless_target), "--draft", str(tiny_models.close_drafter)),
        *("--drafter", "fixed", "--ctx-size", str(CTX), "--threads", "1"),
        *("--api-key", KEY, "--api-key", SECOND_KEY, "--json-log"),
        home=home,
    )
    yield process
    assert process.stop() == 0, "\n".join(process.lines)
    assert "specdec serve: stopped" in process.lines


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def http(server, method: str, path: str, *, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = kwargs.pop("headers", {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if "content" in kwargs:  # raw bodies are still sent as JSON, as a client library sends them
        headers.setdefault("Content-Type", "application/json")
    return httpx.request(method, server.url + path, headers=headers, timeout=60, **kwargs)


def complete(server, prompt: str, max_tokens: int = 8, **fields) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, **fields}
    response = http(server, "POST", "/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chat_answer(client, text: str, max_tokens: int, **fields):
    return client.chat.completions.create(
        model="target",
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
        **fields,
    )


# ---- the official openai client -------------------------------------------------------------


def test_models_lists_the_target(client):
    assert [model.id for model in client.models.list()] == ["target"]


def test_chat_completion(client):
    answer = chat_answer(client, "the cat sat on", 32)
    choice = answer.choices[0]
    assert answer.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    usage = answer.usage
    assert usage.completion_tokens == 32
    assert usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    specdec = usage.model_extra["specdec"]
    assert 0 < specdec["accepted"] <= specdec["drafted"]  # --drafter fixed drafts every round
    assert specdec["target_passes"] < 32
    assert specdec["tokens_per_pass"] == pytest.approx(32 / specdec["target_passes"], abs=1e-3)


def test_a_streamed_answer_comes_in_pieces_that_join_to_the_whole(client):
    # That the pieces come while the answer is made, not at its end: the disconnect test.
    stream = chat_answer(
        client, LONG_CHAT, 300, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 300
    assert len(pieces) > 10
    whole = chat_answer(client, LONG_CHAT, 300)
    assert "".join(pieces) == whole.choices[0].message.content


def test_a_prediction_leaves_the_answer_and_fixed_drafts_count_none_of_it(client):
    plain = chat_answer(client, "the cat sat on", 40)
    text = plain.choices[0].message.content
    predicted = chat_answer(
        client, "the cat sat on", 40, prediction={"type": "content", "content": text}
    )
    assert predicted.choices[0].message.content == text  # a prediction never changes the answer
    details = predicted.usage.completion_tokens_details
    # This server drafts with --drafter fixed, which ignores predictions: none are counted.
    # (Counting drafts that follow a prediction: test_prediction.py and test_chat.py.)
    assert "prediction" not in predicted.usage.model_extra["specdec"]["draft_sources"]
    assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
    parts = chat_answer(
        client,
        "the cat sat on",
        40,
        prediction={"type": "content", "content": [{"type": "text", "text": text}]},
    )
    assert parts.choices[0].message.content == text


def test_completions_endpoint(client):
    answer = client.completions.create(model="target", prompt="the cat", max_tokens=12)
    assert answer.object == "text_completion"
    assert answer.choices[0].text
    assert answer.usage.completion_tokens == 12


def test_chat_logprobs_are_the_answer_tokens_streamed_or_not(client):
    answer = chat_answer(client, "the cat sat on", 24, logprobs=True, top_logprobs=3)
    choice = answer.choices[0]
    content = choice.logprobs.content
    assert len(content) == answer.usage.completion_tokens == 24
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert bytes(entry.bytes).decode() == entry.token
        alternatives = [alt.logprob for alt in entry.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        # greedy: each token is its position's likeliest
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, alternatives[0])
        assert entry.logprob <= 0
    stream = chat_answer(client, "the cat sat on", 24, logprobs=True, top_logprobs=3, stream=True)
    streamed = [
        entry
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert chat_answer(client, "the cat sat on", 4).choices[0].logprobs is None


def test_tokens_a_stop_string_cut_still_stream_their_logprobs(client):
    plain = chat_answer(client, LONG_CHAT, 24, logprobs=True).choices[0].logprobs.content
    stop = plain[10].token + plain[11].token  # held back as it grows, then cut
    asked = {"logprobs": True, "stop": [stop]}
    whole = chat_answer(client, LONG_CHAT, 24, **asked)
    stream = chat_answer(client, LONG_CHAT, 24, stream=True, **asked)
    streamed = [
        entry.token
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert whole.choices[0].finish_reason == "stop"
    cut = [entry.token for entry in whole.choices[0].logprobs.content]
    assert streamed == cut == [entry.token for entry in plain[: len(cut)]]
    assert len(cut) == whole.usage.completion_tokens


def test_completion_logprobs_and_their_offsets(server):
    choice = complete(server, "the cat", max_tokens=16, logprobs=2)["choices"][0]
    columns, text = choice["logprobs"], choice["text"]
    assert len(columns["tokens"]) == len(columns["token_logprobs"]) == 16
    assert "".join(columns["tokens"]) == text
    assert [
        text[at:].startswith(t)
        for at, t in zip(columns["text_offset"], columns["tokens"], strict=True)
    ] == [True] * 16
    assert all(len(top) == 2 for top in columns["top_logprobs"])
    assert complete(server, "the cat", max_tokens=4)["choices"][0]["logprobs"] is None


def test_a_conversation_reuses_the_cached_prefix(client):
    # exact mode keeps what the first request decoded as a fresh prefill would decode it (the
    # second answer must not depend on what is cached): tests/prompt_reuse.py
    history = [{"role": "user", "content": "the cat sat on the mat " * 40}]
    first = client.chat.completions.create(model="target", messages=history, max_tokens=20)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then"},
    ]
    second = client.chat.completions.create(model="target", messages=history, max_tokens=20)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > PROMPT_CHUNK
    assert_exact_reuse(cached, first.usage.prompt_tokens, second.usage.prompt_tokens)


# ---- raw HTTP: what a client library would refuse to send -----------------------------------

GOOD = {"messages": [{"role": "user", "content": "what is the time"}], "max_tokens": 8}
BAD_REQUESTS = {
    "malformed JSON": (b'{"messages": [', 400, None),
    "not an object": (b"[1, 2]", 400, None),
    "empty body": (b"", 400, None),
    "messages of the wrong type": ({"messages": "hi"}, 400, "messages"),
    "temperature as a string": ({**GOOD, "temperature": "hot"}, 400, "temperature"),
    "temperature out of range": ({**GOOD, "temperature": 5}, 400, "temperature"),
    "max_tokens zero": ({**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens as a bool": ({**GOOD, "max_tokens": True}, 400, "max_tokens"),
    "top_p above one": ({**GOOD, "top_p": 1.5}, 400, "top_p"),
    "a seed beyond 64 bits": ({**GOOD, "seed": 2**63}, 400, "seed"),
    "unknown field": ({**GOOD, "frobnicate": 1}, 400, "frobnicate"),
    "no messages": ({"messages": []}, 400, "messages"),
    "an unknown role": ({"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    "an image part": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        None,
    ),
    "n of two": ({**GOOD, "n": 2}, 400, "n"),
    "tools": ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    "a prediction of the wrong type": ({**GOOD, "prediction": {"type": "x"}}, 400, None),
    "a schema keyword that would be ignored": (
        {
            **GOOD,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 0}},
            },
        },
        400,
        "response_format.json_schema.schema",
    ),
    "a grammar llama.cpp cannot parse": ({**GOOD, "grammar": "root ::= ("}, 400, None),
    "two constraints at once": (
        {**GOOD, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
        400,
        None,
    ),
    "a 100 kB prompt": (
        {"messages": [{"role": "user", "content": "0123456789" * 10_000}]},
        400,
        "messages",
    ),
}


@pytest.fixture(scope="module")
def reference(server):
    response = http(server, "POST", "/v1/chat/completions", json=GOOD)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def assert_still_answers(server, reference: str) -> None:
    response = http(server, "POST", "/v1/chat/completions", json=GOOD)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == reference


def assert_error_shape(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, reference, case):
    body, status, param = BAD_REQUESTS[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http(server, "POST", "/v1/chat/completions", content=content)
    error = assert_error_shape(response, status)
    if param is not None:
        assert error["param"] == param
    if case == "a 100 kB prompt":
        assert error["code"] == "context_length_exceeded"
    assert_still_answers(server, reference)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nothing"), ("POST", "/v1/embeddings"), ("GET", "/v1/models/gpt-4o")],
)
def test_unknown_routes_and_models_are_404(server, method, path):
    assert_error_shape(http(server, method, path), 404)


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-key", "Bearer", f"Basic {KEY}", f"Bearer {KEY}x"]
)
def test_a_missing_or_wrong_api_key_is_401(server, reference, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path, body in [
        ("POST", "/v1/chat/completions", GOOD),
        ("POST", "/v1/completions", {"prompt": "x"}),
        ("GET", "/v1/models", None),
    ]:
        response = http(server, method, path, key=None, headers=dict(headers), json=body)
        assert_error_shape(response, 401)
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert http(server, "GET", "/health", key=None).json()["status"] == "ok"
    assert_still_answers(server, reference)


def test_a_cross_origin_page_cannot_make_it_generate(server, reference):
    # What a browser sends for a page's "simple" POST (no preflight), and after DNS rebinding
    # (a name of the page's that now resolves to 127.0.0.1): refused before any generation.
    received = http(server, "GET", "/health").json()["received"]
    body = json.dumps({"prompt": "x", "max_tokens": 4})
    page = {"Origin": "https://attacker.example", "Content-Type": "text/plain"}
    error = assert_error_shape(
        http(server, "POST", "/v1/completions", content=body, headers=page), 403
    )
    assert error["code"] == "origin_not_allowed"
    port = server.url.rsplit(":", 1)[1]
    rebound = {"Host": f"attacker.example:{port}"}
    assert_error_shape(http(server, "POST", "/v1/completions", content=body, headers=rebound), 403)
    as_text = {"Content-Type": "text/plain"}
    assert_error_shape(http(server, "POST", "/v1/completions", content=body, headers=as_text), 415)
    assert http(server, "GET", "/health").json()["received"] == received
    assert_still_answers(server, reference)


def test_every_configured_key_is_accepted_and_answers_the_same(server, reference):
    for key in (SECOND_KEY, KEY):
        response = http(server, "POST", "/v1/chat/completions", key=key, json=GOOD)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == reference


# ---- many clients, and clients that leave ----------------------------------------------------


def test_eight_clients_at_once_are_answered_in_arrival_order(server):
    # The first streams a long answer (6000 tokens, ~40 s here) and is held until the seven
    # others, arriving one by one, are all waiting behind it; then its client leaves.
    asks = [(f"{'the ' * i}cat number {i}", 150 + i) for i in range(1, 8)]
    results: dict[int, dict] = {}
    received = http(server, "GET", "/health").json()["received"]
    all_waiting = threading.Event()
    first_id: list[str] = []

    def hold_the_models() -> None:
        body = {"prompt": LONG_PROMPT, "max_tokens": 6000, "stream": True}
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream(
            "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=120
        ) as response:
            lines = response.iter_lines()  # kept: a dropped line iterator closes the stream
            first_line = next(line for line in lines if line)
            first_id.append(json.loads(first_line[6:])["id"])
            all_waiting.wait(300)

    def ask(i: int) -> None:
        prompt, max_tokens = asks[i]
        results[i] = complete(server, prompt, max_tokens=max_tokens)

    holder = threading.Thread(target=hold_the_models)
    holder.start()
    wait_for_health(server, lambda h: h["received"] == received + 1 and h["busy"])
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(7)]
    for i, thread in enumerate(threads):
        thread.start()
        wait_for_health(server, lambda h, i=i: h["received"] == received + i + 2)
    health = http(server, "GET", "/health").json()
    all_waiting.set()
    holder.join(120)
    for thread in threads:
        thread.join(120)
    assert health["busy"] and health["queued"] == 7  # all seven really there at once
    assert sorted(results) == list(range(7)), "a request was lost"

    ids = [results[i]["id"] for i in range(7)]
    server.wait_for_log(lambda r: r.get("id") == ids[-1])
    logged = [r["id"] for r in server.log() if r.get("id") in [*first_id, *ids]]
    assert logged == [*first_id, *ids]  # answered one at a time, first come first served

    for i, answer in results.items():  # nobody got someone else's answer
        alone = complete(server, asks[i][0], max_tokens=asks[i][1])
        assert answer["choices"][0]["text"] == alone["choices"][0]["text"], i
        assert answer["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]
        assert answer["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]


def test_a_client_that_disconnects_mid_stream_frees_the_models(server):
    body = {"prompt": LONG_PROMPT, "max_tokens": 6000, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received and received[0].startswith("data: ")
        # The first pieces came while the answer is still being made (6000 tokens, ~40 s).
        assert http(server, "GET", "/health").json()["busy"]
    answer = complete(server, "the cat", max_tokens=8)  # queued behind the abandoned answer
    assert answer["usage"]["completion_tokens"] == 8
    abandoned = server.wait_for_log(
        lambda r: r.get("stream") and r.get("finish_reason") == "interrupted"
    )
    assert abandoned["status"] == 499
    assert abandoned["completion_tokens"] < 1000  # stopped, not run to its end first


def test_a_client_that_leaves_a_plain_request_stops_it(server):
    body = {"prompt": LONG_PROMPT, "max_tokens": 6000}
    headers = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=0.5)
    assert complete(server, "the cat", max_tokens=8)["usage"]["completion_tokens"] == 8
    abandoned = server.wait_for_log(
        lambda r: not r.get("stream") and r.get("finish_reason") == "interrupted"
    )
    assert abandoned["status"] == 499
    assert abandoned["completion_tokens"] < 6000


def test_any_model_name_is_answered_by_the_servers_own_and_noted_once(server):
    for name in ("gpt-4o", "another-client's-model", "gpt-4o"):
        response = http(server, "POST", "/v1/chat/completions", json={**GOOD, "model": name})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "target"
    notices = [r["notice"] for r in server.log() if "notice" in r]
    assert len(notices) == 1, notices
    assert "`gpt-4o`" in notices[0] and "`target` answers" in notices[0]


def test_every_request_is_logged(server):
    log = [r for r in server.log() if "notice" not in r]
    assert log, "\n".join(server.lines)
    answered = [r for r in log if r["status"] == 200 and r["path"] == "/v1/chat/completions"]
    assert answered and all("tokens_per_second" in r and "acceptance" in r for r in answered)
    assert any(r["status"] == 401 for r in log)


# ---- identity with `specdec run` ------------------------------------------------------------


@pytest.mark.parametrize("prompt", ["the cat sat on", "what is the time"])
def test_greedy_output_is_byte_identical_to_specdec_run(server, tiny_models, prompt):
    models = ("--target", str(tiny_models.target), "--draft", str(tiny_models.close_drafter))
    same = (*models, "--drafter", "fixed", "--ctx-size", str(CTX), "--threads", "1", "-n", "48")
    chat = http(
        server,
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 48},
    ).json()
    ran = run_json(prompt, *same)
    assert chat["choices"][0]["message"]["content"] == ran["text"]
    assert chat["usage"]["completion_tokens"] == ran["stats"]["generated_tokens"]
    assert chat["usage"]["prompt_tokens"] == ran["stats"]["prompt_tokens"]

    raw = complete(server, prompt, max_tokens=48)
    ran_raw = run_json(prompt, "--raw", *same)
    assert raw["choices"][0]["text"] == ran_raw["text"]


def test_penalties_reach_the_engine_as_specdec_runs_take_them(server, tiny_models):
    models = (
        "--target",
        str(tiny_models.endless_target),
        "--draft",
        str(tiny_models.close_drafter),
    )
    same = (*models, "--drafter", "fixed", "--ctx-size", str(CTX), "--threads", "1", "-n", "48")
    fields = {"frequency_penalty": -2.0, "presence_penalty": -2.0}  # repeats favoured
    penalised = complete(server, "the cat sat on", max_tokens=48, **fields)["choices"][0]["text"]
    ran = run_json(
        "the cat sat on", "--raw", *same, "--frequency-penalty", "-2", "--presence-penalty", "-2"
    )
    assert penalised == ran["text"]
    assert penalised != complete(server, "the cat sat on", max_tokens=48)["choices"][0]["text"]


def test_logit_bias_reaches_the_engine(server):
    favoured = {"300": 100}  # all but forces token 300
    columns = complete(server, "the cat", max_tokens=6, logit_bias=favoured, logprobs=0)
    tokens = columns["choices"][0]["logprobs"]["tokens"]
    assert len(set(tokens)) == 1 and len(tokens) == 6
    plain = complete(server, "the cat", max_tokens=6, logprobs=0)["choices"][0]["logprobs"]
    assert plain["tokens"] != tokens
    too_far = http(
        server, "POST", "/v1/completions", json={"prompt": "a", "logit_bias": {"99999": 1}}
    )
    assert too_far.status_code == 400 and too_far.json()["error"]["param"] == "logit_bias"


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
    "required": ["ok", "size"],
}


def test_structured_answers_match_and_are_specdec_runs(server, tiny_models, tmp_path):
    models = ("--target", str(tiny_models.endless_target))
    models += ("--draft", str(tiny_models.close_drafter))
    same = (*models, "--drafter", "fixed", "--ctx-size", str(CTX), "--threads", "1", "-n", "48")
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    wrapped = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 48}
    chat = http(server, "POST", "/v1/chat/completions", json={**body, "response_format": wrapped})
    assert chat.status_code == 200, chat.text
    text = chat.json()["choices"][0]["message"]["content"]
    assert json.loads(text)["size"] in ("small", "large")
    assert text == run_json("the cat", *same, "--json-schema", str(schema_file))["text"]

    # at most three words: the grammar ends the answer (the endless target never would)
    grammar = (
        'root ::= word | word " " word | word " " word " " word\nword ::= "cat" | "sat" | "mat"\n'
    )
    grammar_file = tmp_path / "words.gbnf"
    grammar_file.write_text(grammar)
    raw = complete(server, "the cat", max_tokens=12, grammar=grammar)
    words = raw["choices"][0]["text"].split(" ")
    assert set(words) <= {"cat", "sat", "mat"}, words
    ran = run_json("the cat", "--raw", *same, "-n", "12", "--grammar", str(grammar_file))
    assert raw["choices"][0]["text"] == ran["text"]


# ---- a full queue, shutdown, start-up errors ------------------------------------------------


def test_a_full_queue_answers_503_and_shutdown_is_clean(tiny_models, tmp_path):
    server = ServerProcess(
        *("--target", str(tiny_models.endless_target), "--no-draft", "--max-queue", "1"),
        *("--ctx-size", str(CTX), "--threads", "1"),
        home=tmp_path,
    )
    body = {"prompt": LONG_PROMPT, "max_tokens": 6000, "stream": True}
    streamed: list[dict] = []
    first_chunk = threading.Event()
    queued: list[httpx.Response] = []

    def stream_the_long_answer() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(json.loads(line[6:]))
                    first_chunk.set()

    def wait_in_the_queue() -> None:
        queued.append(httpx.post(server.url + "/v1/completions", json=body, timeout=60))

    threads = [threading.Thread(target=stream_the_long_answer)]
    try:
        threads[0].start()
        assert first_chunk.wait(30), "the first request never started"
        threads.append(threading.Thread(target=wait_in_the_queue))
        threads[1].start()
        deadline = time.monotonic() + 120  # only catches a hang
        while httpx.get(server.url + "/health").json()["queued"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.02)

        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        assert_error_shape(refused, 503)
        assert refused.headers["Retry-After"] == "1"

        # Ctrl-C with one answer streaming and one waiting: both end, and the process exits
        # 0 (server.stop's timeout catches a hang).
        assert server.stop() == 0, "\n".join(server.lines)
        for thread in threads:
            thread.join(60)
        assert "error" in streamed[-1]  # the stream says why it ends early
        assert len(streamed) < 6000  # ended by the shutdown, not after its 6000 tokens
        assert streamed[-1]["error"]["message"] == "The server is shutting down."
        assert queued and queued[0].status_code == 503
    finally:
        server.stop()


def test_port_in_use_and_the_network_warning(tiny_models):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            app,
            [
                "serve",
                "--target",
                str(tiny_models.target),
                "--no-draft",
                "--host",
                "0.0.0.0",
                "--port",
                str(port),
            ],
        )
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert "open" in lines[0] and "network" in lines[0] and "--api-key" in lines[0]
    assert f"cannot listen on 0.0.0.0:{port}" in lines[1]


# ---- the real pair --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_pair(shared_model_cache) -> tuple[Path, Path]:
    """The default pair from the user's model cache (pulled there once), as test_real_pair."""
    from specdec_cli.models.resolve import resolve_model

    return resolve_model("large").path, resolve_model("small").path


@pytest.mark.slow
def test_the_real_pair_through_the_openai_client(real_pair):
    """Greedy output byte-identical to `specdec run` with the same settings (both fresh,
    both drafting the same fixed way, so the same decodes run in the same order), a
    prediction that leaves the answer unchanged, and a second turn that keeps the whole prompt
    chunks of the first in the cache (exact mode)."""
    target, drafter = real_pair
    settings = ("--drafter", "fixed", "--ctx-size", "2048", "-n", "64")
    models = ("--target", str(target), "--draft", str(drafter))
    question = "Write a Python function that checks whether a string is a palindrome."
    server = ServerProcess(*models, *settings, "--json-log", home=None)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": question}]
        first = client.chat.completions.create(model=target.stem, messages=messages)
        text = first.choices[0].message.content
        assert first.usage.model_extra["specdec"]["accepted"] > 0
        predicted = client.chat.completions.create(
            model=target.stem,
            messages=messages,
            prediction={"type": "content", "content": text},
        )
        assert predicted.choices[0].message.content == text
        details = predicted.usage.completion_tokens_details
        specdec = predicted.usage.model_extra["specdec"]
        # --drafter fixed ignores predictions (README): nothing drafted from it, none counted.
        assert "prediction" not in specdec["draft_sources"]
        assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
        follow_up = [
            *messages,
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Now make it ignore case."},
        ]
        second = client.chat.completions.create(model=target.stem, messages=follow_up)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert_exact_reuse(cached, first.usage.prompt_tokens, second.usage.prompt_tokens)
    finally:
        assert server.stop() == 0, "\n".join(server.lines)
    ran = run_json(question, *models, *settings)
    assert text == ran["text"]
