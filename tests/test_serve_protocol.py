"""The server's request validation, request defaults and log lines, without a server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from fakes import decode_request

from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.serve.render_serve import RequestLog, RequestRecord, request_line
from specdec_cli.serve.serve_protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from specdec_cli.serve.server import ServerState

USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return parse_request(json.dumps({"messages": USER, **fields}).encode(), ChatCompletionRequest)


def refused(**fields) -> ApiError:
    with pytest.raises(ApiError) as error:
        chat(**fields)
    assert error.value.status == 400
    return error.value


def test_neutral_values_of_unimplemented_fields_are_accepted():
    # What editors and SDKs commonly send explicitly.
    chat(
        n=1,
        frequency_penalty=0,
        presence_penalty=0.0,
        logprobs=False,
        user="someone",
        tool_choice="none",
        tools=[],
        response_format={"type": "text"},
        stream=True,
        stream_options={"include_usage": True},
        metadata={"a": "b"},
        store=False,
        parallel_tool_calls=False,
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"presence_penalty": 2.5}, "presence_penalty"),  # OpenAI's range: -2 to 2
        ({"top_logprobs": 3}, "top_logprobs"),  # needs logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # OpenAI's most: 20
        ({"logit_bias": {"hello": 5}}, "logit_bias"),  # keys are token ids
        ({"logit_bias": {"42": 101}}, "logit_bias"),  # OpenAI's range: -100 to 100
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop": ["x"] * 5}, "stop"),  # OpenAI takes at most four
        ({"temperature": float("inf")}, "temperature"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"service_tier": "flex"}, "service_tier"),
    ],
)
def test_fields_that_would_be_ignored_are_refused(fields, param):
    assert refused(**fields).param == param


def test_messages_for_the_template():
    request = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert request.chat_messages("server default") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},  # one part a line, as llama.cpp joins them
        {"role": "assistant", "content": ""},
    ]
    assert chat().chat_messages("server default")[0] == {
        "role": "system",
        "content": "server default",
    }
    assert chat().chat_messages(None) == USER


def test_a_completion_prompt_is_one_string():
    body = {"prompt": ["one", "two"]}
    with pytest.raises(ApiError) as error:
        parse_request(json.dumps(body).encode(), CompletionRequest)
    assert error.value.param == "prompt"
    request = parse_request(b'{"prompt": ["one"]}', CompletionRequest)
    assert request.prompt_text() == "one"


def test_request_fields_override_the_server_defaults(tiny_models):
    decode = decode_request(
        target=Path(tiny_models.target),
        sampling=SamplingSettings(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05),
        seed=7,
        max_tokens=100,
        stop=("END",),
    )
    state = ServerState(None, decode, log=None)
    defaults = state.settings_for(chat())
    assert defaults == decode.generation_settings()
    custom = state.settings_for(
        chat(temperature=0.7, top_k=5, max_completion_tokens=9, max_tokens=50, stop="x", seed=1)
    )
    assert custom.sampling == SamplingSettings(temperature=0.7, top_k=5, top_p=0.95, min_p=0.05)
    assert custom.max_tokens == 9  # max_completion_tokens is the newer name, and wins
    assert custom.stop == ("x",)
    assert custom.seed == 1
    assert custom.draft_max == 8


def test_model_names():
    state = ServerState.__new__(ServerState)
    state.model_id, state.model_names = "m", {"m", "m.gguf", "large"}
    state.check_model(None)
    state.check_model("large")
    with pytest.raises(ApiError) as error:
        state.check_model("gpt-4o")
    assert error.value.status == 404 and error.value.code == "model_not_found"


@pytest.mark.parametrize("json_lines", [False, True], ids=["text", "json"])
def test_another_model_name_is_answered_and_noted_once(json_lines):
    decode = decode_request()
    stream = io.StringIO()
    state = ServerState(None, decode, log=RequestLog(stream, json_lines=json_lines))
    for name in (None, "m", "m.gguf", "gpt-4o", "claude", "gpt-4o"):
        state.note_model_name(name)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    notice = json.loads(lines[0])["notice"] if json_lines else lines[0]
    assert "the model `gpt-4o`: `m` answers it" in notice


def test_the_text_log_line():
    from specdec_cli.decoding.engine import GenerationStats

    stats = GenerationStats(generated=40, drafted=30, accepted=24, target_passes=10, seconds=2.0)
    record = RequestRecord("POST", "/v1/chat/completions", started=0.0, stream=True)
    record.prompt_tokens, record.cached_tokens = 120, 100
    record.stats, record.finish_reason = stats, "stop"
    line = request_line(record.as_dict(seconds=2.5))
    for part in (
        "POST /v1/chat/completions 200 stream",
        "prompt 120 (cached 100)",
        "40 tokens 20.0 tok/s",
        "accepted 24/30 (80%)",
        "4.00 tok/pass",
        "stop",
        "2.50 s",
    ):
        assert part in line
    assert "\n" not in line


def test_neutral_bookkeeping_values_are_accepted():
    chat(stop=["a", "b", "c", "d"], service_tier="auto")
    chat(service_tier="default")


def test_content_the_model_cannot_take_in_is_named():
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    error = refused(messages=[image])
    assert error.param == "messages.0.content"
    assert "'image_url' content is not supported" in error.message


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3]]], ids=["tokens", "token lists"])
def test_a_prompt_of_token_ids_is_refused_in_one_line(prompt):
    with pytest.raises(ApiError) as error:
        parse_request(json.dumps({"prompt": prompt}).encode(), CompletionRequest)
    assert error.value.param == "prompt"
    assert error.value.message == "prompt as token ids is not supported: send text."


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_token_limit_the_context_cannot_hold_is_refused(field):
    state = ServerState(None, decode_request(), log=None, context_tokens=8192)
    state.settings_for(chat(**{field: 8191}))
    with pytest.raises(ApiError) as error:
        state.settings_for(chat(**{field: 100_000}))
    assert error.value.status == 400 and error.value.param == field
    assert error.value.code == "invalid_value"
    assert "100000" in error.value.message and "8192" in error.value.message


def test_null_is_a_field_left_out():
    # OpenAI's document lets any optional field be null (tests/test_serve_conformance.py).
    request = chat(stream=None, stream_options=None, user=None)
    assert not request.stream and not request.include_usage()
    streamed = chat(stream=True, stream_options={"include_usage": None})
    assert not streamed.include_usage()


def test_an_integer_may_be_written_as_a_whole_float():
    request = chat(max_tokens=8.0, seed=3.0, n=1.0)
    assert request.max_tokens == 8 and request.seed == 3
    assert refused(max_tokens=8.5).param == "max_tokens"
    assert refused(max_tokens=True).param == "max_tokens"


def test_negative_seeds_are_openais_and_read_as_unsigned():
    state = ServerState(None, decode_request(), log=None)
    assert state.settings_for(chat(seed=-1)).seed == 2**64 - 1
    assert state.settings_for(chat(seed=5)).seed == 5
    assert refused(seed=-(2**63) - 1).param == "seed"


def test_a_tool_message_says_which_call_it_answers():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    chat(messages=[*asked, {"role": "tool", "content": "4", "tool_call_id": "c1"}])
    error = refused(messages=[*asked, {"role": "tool", "content": "4"}])
    assert error.param == "messages.2.tool_call_id"


def test_an_answer_sent_back_as_it_came_is_accepted():
    # OpenAI's answers, and specdec's, carry "refusal": null; a refusal's text is refused.
    answered = {"role": "assistant", "content": "hi", "refusal": None}
    chat(messages=[*USER, answered], safety_identifier="user-1", prompt_cache_key="k")
    error = refused(messages=[*USER, {**answered, "refusal": "no"}])
    assert error.param == "messages.1.refusal"
