"""Tool calls over `specdec serve` and `specdec run --tools`: the model's own template
renders the tools, what it writes between <tool_call> tags becomes OpenAI's tool_calls (run:
one JSON line per call), and a call that must be made is forced by a grammar built from the
functions' parameter schemas."""

from __future__ import annotations

import json
import re

import openai
import pytest
from click.testing import Result
from llama_cpp_template import llama_cpp_prompt
from test_server import KEY, ServerProcess, http
from tiny_gguf import TARGET_SEED, TOOLS_TEMPLATE, write_tiny_llama
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.backend import encode_chat, encode_template_text
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.models.resolve import resolve_model
from specdec_cli.serve.serve_protocol import ApiError, ChatCompletionRequest
from specdec_cli.services.tool_calls import (
    HeldText,
    read_tools,
    split_calls,
    template_speaks_tools,
)
from specdec_cli.structured import StructureError

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "rain": {"type": "boolean"}},
    "required": ["city", "rain"],
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 8}},
    "required": ["query"],
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function",
     "function": {"name": "search", "description": "find", "parameters": SEARCH}},
]  # fmt: skip
ASK = [{"role": "user", "content": "the cat sat on"}]


@pytest.fixture(scope="module")
def tools_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools")
    return write_tiny_llama(folder / "tools_target.gguf", seed=TARGET_SEED,
                            chat_template=TOOLS_TEMPLATE, name="tiny-tools")  # fmt: skip


@pytest.fixture(scope="module")
def tool_server(tiny_models, tools_target):
    process = ServerProcess(
        *("--target", str(tools_target), "--draft", str(tiny_models.close_drafter)),
        *("--drafter", "fixed", "--threads", "1", "--api-key", KEY),
        home=tools_target.parent / "home",
    )
    yield process
    assert process.stop() == 0, "\n".join(process.lines)


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def matches(name: str, arguments: dict) -> bool:
    if name == "weather":
        return set(arguments) == {"city", "rain"} and arguments["city"] in ("Paris", "Oslo") \
            and isinstance(arguments["rain"], bool)  # fmt: skip
    return set(arguments) == {"query"} and len(arguments["query"]) <= 8


def test_a_required_call_parses_matches_and_streams_the_same(client):
    answer = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert matches(call.function.name, json.loads(call.function.arguments)), call

    stream = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                            tool_choice="required", max_tokens=200,
                                            temperature=0, stream=True)  # fmt: skip
    name, arguments, finish = "", "", None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.index == 0
            name += delta.function.name or ""
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (call.function.name, call.function.arguments, "tool_calls")


def test_a_named_function_is_the_one_called(client):
    for name in ("weather", "search"):
        answer = client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0,
            tool_choice={"type": "function", "function": {"name": name}},
        )  # fmt: skip
        (call,) = answer.choices[0].message.tool_calls
        assert call.function.name == name and matches(name, json.loads(call.function.arguments))


def test_a_conversation_with_a_call_and_its_result_is_answered(client):
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Oslo", "rain": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain, 4 degrees"},
    ]  # fmt: skip
    answer = client.chat.completions.create(
        model="m", messages=history, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_without_tools_in_its_template_a_model_refuses_them(tool_server, tiny_models, tmp_path):
    plain = ServerProcess("--target", str(tiny_models.target), "--no-draft", "--threads", "1",
                          home=tmp_path)  # fmt: skip
    try:
        body = {"messages": ASK, "tools": TOOLS, "max_tokens": 4}
        response = http(plain, "POST", "/v1/chat/completions", key=None, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tools" and "cannot express tools" in error["message"]
        plain_body = {"messages": ASK, "max_tokens": 4}
        assert http(plain, "POST", "/v1/chat/completions", key=None, json=plain_body).is_success
    finally:
        assert plain.stop() == 0


# ---- specdec run --tools ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_file(tools_target):
    path = tools_target.parent / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return path


def run_tools(tiny_models, target, tools_file, *extra: str) -> Result:
    """`specdec run` with the server's drafting, or alone where `extra` says --no-draft."""
    drafting = ("--draft", str(tiny_models.close_drafter), "--drafter", "fixed")
    args = ["run", ASK[0]["content"], "--target", str(target), "--tools", str(tools_file)]
    alone = "--no-draft" in extra
    return CliRunner().invoke(app, [*args, *(() if alone else drafting), "--threads", "1",
                                    "-n", "300", *extra])  # fmt: skip


def test_run_prints_a_forced_call_as_one_json_line_the_call_serve_makes(
    tiny_models, tools_target, tools_file, client
):
    printed = run_tools(tiny_models, tools_target, tools_file, "--tool-choice", "required")
    assert printed.exit_code == 0, printed.output
    line = json.loads(printed.stdout)  # the whole of stdout: one call, nothing else
    served = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, max_tokens=300,
                                            tool_choice="required", temperature=0)  # fmt: skip
    call = served.choices[0].message.tool_calls[0].function
    assert matches(line["name"], line["arguments"])
    assert (line["name"], line["arguments"]) == (call.name, json.loads(call.arguments))


def test_run_json_gives_the_calls_in_openai_shape_and_the_target_alones_tokens(
    tiny_models, tools_target, tools_file
):
    record = json.loads(run_tools(tiny_models, tools_target, tools_file, "--json",
                                  "--tool-choice", "search").stdout)  # fmt: skip
    alone = json.loads(run_tools(tiny_models, tools_target, tools_file, "--json",
                                 "--tool-choice", "search", "--no-draft").stdout)  # fmt: skip
    assert record["finish_reason"] == "tool_calls" and record["text"] == ""
    [call] = record["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "search"
    assert matches("search", json.loads(call["function"]["arguments"]))
    assert record["tokens"] == alone["tokens"] and record["stats"]["drafted"] > 0
    assert record["settings"]["tools"] == ["weather", "search"]


def test_run_with_tools_it_does_not_call_prints_its_answer_as_text(
    tiny_models, tools_target, tools_file
):
    printed = run_tools(tiny_models, tools_target, tools_file, "-n", "24")
    as_json = run_tools(tiny_models, tools_target, tools_file, "-n", "24", "--json")
    record = json.loads(as_json.stdout)
    assert record["tool_calls"] == [] and record["finish_reason"] == "length"
    assert printed.stdout == record["text"] + "\n"


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        (["--tool-choice", "nope"], 2, "--tool-choice nope is none of"),
        (["--raw"], 2, "--raw leaves out"),
        (["--tool-choice", "required", "--grammar", "GRAMMAR"], 2, "both constrain"),
    ],
)
def test_run_refuses_tool_options_that_contradict(tiny_models, tools_target, tools_file, extra,
                                                  code, says):  # fmt: skip
    grammar = tools_file.parent / "yes.gbnf"
    grammar.write_text('root ::= "yes"')
    extra = [str(grammar) if part == "GRAMMAR" else part for part in extra]
    refused = run_tools(tiny_models, tools_target, tools_file, *extra)
    assert refused.exit_code == code and says in refused.stderr, refused.output


def test_run_refuses_tools_a_template_cannot_express(tiny_models, tools_file):
    refused = run_tools(tiny_models, tiny_models.target, tools_file)
    assert refused.exit_code == 1 and "cannot express tools" in refused.stderr
    assert refused.stdout == ""


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{oops", "is not JSON"),
        ("[]", "non-empty JSON list"),
        ('[{"type": "function", "function": {"description": "x"}}]', "tool 0 has no name"),
        (json.dumps([TOOLS[0], TOOLS[0]]), "two tools have the same name"),
        (json.dumps([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "number", "minimum": 1}}}}}]),
         "tool 0 (f) parameters.properties.n: the JSON-schema keyword 'minimum'"),
    ],
)  # fmt: skip
def test_a_tools_file_that_cannot_be_used_says_what_is_wrong(text, says):
    with pytest.raises(StructureError, match=re.escape(says)):
        read_tools(text, "--tools t.json")


def test_the_tools_file_is_what_serve_takes():
    functions = read_tools(json.dumps(TOOLS), "t")
    assert [f.template_entry() for f in functions] == chat().template_tools()


# ---- the protocol and the parsing (no model) --------------------------------------------------


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, **fields})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "number", "minimum": 1}}}}}]},
         "tools.0.function.parameters"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "weather", "arguments": "{oops"}}]}]},
         "messages.1.tool_calls.0.function.arguments"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, None),
    ],
)  # fmt: skip
def test_tool_requests_that_cannot_be_honoured_are_400s_naming_the_field(fields, param):
    with pytest.raises(ApiError) as raised:
        chat(**fields).check_supported()
    assert raised.value.status == 400 and raised.value.param == param


def test_only_a_forced_choice_constrains_the_answer():
    assert chat().structure() is None and chat(tool_choice="auto").structure() is None
    forced = chat(tool_choice="required").structure()
    assert forced is not None and forced.before == "<tool_call>\n"
    assert chat(tool_choice="none").template_tools() is None


def test_calls_are_split_from_the_text_and_unknown_ones_stay_text():
    call = '{"name": "search", "arguments": {"query": "x"}}'
    text = f"Let me look.\n<tool_call>\n{call}\n</tool_call>"
    content, calls = split_calls(text, ["search", "weather"])
    assert content == "Let me look." and [c.name for c in calls] == ["search"]
    assert json.loads(calls[0].arguments) == {"query": "x"}
    other = '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>'
    assert split_calls(other, ["search"]) == (other, [])
    fenced = '```json\n{"name": "weather", "arguments": {"city": "Oslo", "rain": false}}\n```'
    assert split_calls(fenced, ["weather"])[1][0].name == "weather"  # Qwen2.5-Coder, unforced
    assert split_calls("{not json", ["weather"]) == ("{not json", [])


def test_streamed_content_is_held_from_where_a_call_may_begin():
    held = HeldText()
    sent = [held.feed(piece) for piece in ["Sure", ", one ", "moment <tool", '_call>{"na', 'me"']]
    assert "".join(sent) == "Sure, one moment " and held.held.startswith("<tool_call>")
    bare = HeldText()
    assert bare.feed("```js") == "" and bare.feed("on\n{") == ""  # may be a bare call
    words = HeldText()
    assert words.feed("Hello") == "Hello"


def test_only_templates_with_tools_and_the_tags_speak_tools():
    assert template_speaks_tools(TOOLS_TEMPLATE)
    assert not template_speaks_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_speaks_tools(None)


# ---- the prompt of a tool's result: what llama.cpp's Jinja rendering gives ------------------

# A Hermes-style template of this test's own that, as Qwen2.5's does, prints each tool whole
# (`tool | tojson`), each earlier call's arguments with `tojson`, and a tool's answer between
# <tool_response> tags in a user turn.
PRINTING_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}"
    "{{ messages[0].content }}{% else %}You help.{% endif %}\n<tools>{% for tool in tools %}"
    "{{ '\n' }}{{ tool | tojson }}{% endfor %}{{ '\n' }}</tools><|im_end|>{{ '\n' }}{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user{{ '\n' }}<tool_response>"
    "{{ '\n' + m.content + '\n' }}</tool_response><|im_end|>{{ '\n' }}"
    "{% elif m.tool_calls %}<|im_start|>assistant{% if m.content %}{{ '\n' + m.content }}"
    "{% endif %}{% for c in m.tool_calls %}{{ '\n' }}<tool_call>{{ '\n' }}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "{{ '\n' }}</tool_call>{% endfor %}<|im_end|>{{ '\n' }}"
    "{% elif not (m.role == 'system' and tools and loop.first) %}"
    "<|im_start|>{{ m.role }}{{ '\n' + m.content }}<|im_end|>{{ '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)
AGENT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "description": "The weather now in a city"}},
    {"type": "function", "function": {"name": "local_time", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]  # fmt: skip


def a_call(id: str, name: str, arguments: str) -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Two rounds: two calls answered by two tool turns (one in content parts), an answer, a
# second question and a call with words before it, and its result.
AGENT_TURNS = [
    {"role": "user", "content": "Weather in Zürich and the time in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        a_call("call_1", "get_weather", '{"city": "Zürich"}'),
        a_call("call_2", "local_time", '{"city":"Oslo"}')]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 18, "sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call_2",
     "content": [{"type": "text", "text": "09:30"}, {"type": "text", "text": "CET"}]},
    {"role": "assistant", "content": "18 °C and clear in Zürich; 09:30 in Oslo."},
    {"role": "user", "content": "And in Paris?"},
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [a_call("call_3", "get_weather", '{"city": "Paris"}')]},
    {"role": "tool", "tool_call_id": "call_3", "content": '{"celsius": 21, "sky": "rain"}'},
]  # fmt: skip
SYSTEMS = {
    "no-system": [],
    "system": [{"role": "system", "content": "Answer briefly."}],
    "developer": [{"role": "developer", "content": "Answer briefly."}],
}


def serve_prompt(backend, body: dict) -> tuple[str, list[int]]:
    """The prompt `specdec serve` decodes for `body`: its text and its tokens."""
    request = ChatCompletionRequest.model_validate(body)
    request.check_supported()
    messages, tools = request.chat_messages(None), request.template_tools()
    return backend.format_chat(messages, tools), encode_chat(backend, messages, tools)


def assert_prompt_is_llama_cpps(backend, body: dict) -> None:
    info = backend.vocab_info()
    reference = llama_cpp_prompt(backend.chat_template(), body, bos=backend.token_text(info.bos),
                                 eos=backend.token_text(info.eos))  # fmt: skip
    text, tokens = serve_prompt(backend, body)
    assert text == reference
    assert tokens == encode_template_text(backend, reference)


@pytest.fixture(scope="module")
def printing_target(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("printing") / "printing.gguf",
                            seed=TARGET_SEED, chat_template=PRINTING_TEMPLATE)  # fmt: skip
    backend = LlamaBackend(path, n_ctx=512, n_threads=1)
    yield backend
    backend.close()


@pytest.mark.parametrize("system", SYSTEMS.values(), ids=SYSTEMS.keys())
def test_a_tools_result_is_rendered_as_llama_cpp_renders_it(printing_target, system):
    body = {"messages": [*system, *AGENT_TURNS], "tools": AGENT_TOOLS}
    assert_prompt_is_llama_cpps(printing_target, body)
    assert_prompt_is_llama_cpps(printing_target, {"messages": [*system, *AGENT_TURNS]})


@pytest.fixture(scope="module")
def qwen_target(shared_model_cache):
    """The real 1.5B target (downloaded to the user's cache on first use): its own template."""
    backend = LlamaBackend(resolve_model("large").path, n_ctx=512, n_threads=1)
    yield backend
    backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("system", SYSTEMS.values(), ids=SYSTEMS.keys())
def test_qwens_own_template_renders_a_tools_result_as_in_llama_cpp(qwen_target, system):
    body = {"messages": [*system, *AGENT_TURNS], "tools": AGENT_TOOLS}
    assert_prompt_is_llama_cpps(qwen_target, body)
    assert_prompt_is_llama_cpps(qwen_target, {"messages": [*system, *AGENT_TURNS]})
