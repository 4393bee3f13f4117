"""ChatSession and the slash commands, on the tiny GGUF models; `specdec chat` scripted mode."""

from __future__ import annotations

import json

import pytest
from prompt_reuse import assert_exact_reuse
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.commands.chat import (
    ChatSession,
    Command,
    CommandError,
    parse_command,
    user_text,
)
from specdec_cli.decoding.backend import encode_chat, encode_template_text
from specdec_cli.decoding.engine import Finished, GenerationSettings, Piece
from specdec_cli.errors import BadUsageError, ContextOverflowError, ModelFileError
from specdec_cli.llama import library
from specdec_cli.models.loading import load_pair
from specdec_cli.request import HardwareOptions

FIRST = "hello there"
SECOND = "how are you today"


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("hello", None),
        ("  what is /etc?", None),
        ("//etc/hosts is a file", None),
        ("/help", Command("help")),
        ("/?", Command("help")),
        ("/reset", Command("reset")),
        ("/STATS", Command("stats")),
        ("/exit", Command("exit")),
        ("/quit", Command("exit")),
        ("/system You are terse.", Command("system", "You are terse.")),
        ("/system", Command("system", None)),
        ("/draft 4", Command("draft", 4)),
        ("/draft 0", Command("draft", 0)),
        ("/temp 0.7", Command("temp", 0.7)),
        ("/temp 0", Command("temp", 0.0)),
        ("/save notes/chat.md", Command("save", "notes/chat.md")),
        ("/schema person.json", Command("schema", "person.json")),
        ("/schema", Command("schema", None)),
        ("/grammar three.gbnf", Command("grammar", "three.gbnf")),
        ("/grammar", Command("grammar", None)),
    ],
)
def test_parse_command(line, command):
    assert parse_command(line) == command


@pytest.mark.parametrize(
    "line",
    [
        *("/draft", "/draft -1", "/draft two", "/temp", "/temp -0.5", "/temp nan"),
        *("/save", "/reset now", "/frobnicate"),
    ],
)
def test_parse_command_refuses_with_a_hint(line):
    with pytest.raises(CommandError) as error:
        parse_command(line)
    assert error.value.fix  # every refusal says what to type instead


def test_a_doubled_slash_sends_one():
    assert user_text("//etc/hosts") == "/etc/hosts"
    assert user_text("  plain  ") == "plain"


# ---- ChatSession on the tiny pair ------------------------------------------------------------


def new_session(models, *, ctx: int = 4096, drafter=True, system=None, **settings) -> ChatSession:
    draft = models.close_drafter if drafter else None
    pair = load_pair(models.target, draft, HardwareOptions(ctx_size=ctx, threads=1))
    return ChatSession(pair, GenerationSettings(**{"max_tokens": 30, **settings}), system)


def run_turn(session: ChatSession, text: str) -> Finished:
    events = list(session.reply(text).events())
    assert isinstance(events[-1], Finished)
    return events[-1]


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast"])
def test_the_second_turn_decodes_only_what_the_cache_cannot_give(
    tiny_models, monkeypatch, exact, exact_prompts
):
    monkeypatch.setattr(library, "PROMPT_CHUNK", 16)
    draft = tiny_models.close_drafter
    hardware = HardwareOptions(ctx_size=4096, threads=1, exact=exact)
    session = ChatSession(
        load_pair(tiny_models.target, draft, hardware), GenerationSettings(max_tokens=30)
    )
    first = run_turn(session, FIRST)
    turn1 = session.records[0]
    history = encode_chat(session.pair.target, session.messages()[:-1]) + first.tokens
    assert turn1.reused_tokens == 0

    # One token and no draft: the target's only decode is the part of the prompt it lacks.
    session.settings = GenerationSettings(max_tokens=1)
    turn = session.reply(SECOND)
    list(turn.events())
    record = turn.record
    assert turn.generation.prompt[: len(history)] == history  # the history is kept as tokens
    assert first.finish_reason == "length"
    if exact and exact_prompts == "aligned":
        # the first prompt's whole chunks; its partial chunk and the reply are decoded again
        assert record.reused_tokens == turn1.prompt_tokens // 16 * 16 > 0
    else:  # all of it except the reply's last token, which -n cut before decoding
        assert record.reused_tokens == len(history) - 1
    assert record.target_decoded == record.prompt_tokens - record.reused_tokens
    assert record.drafter_decoded == 0


def test_the_drafter_cache_is_reused_too(tiny_models):
    session = new_session(tiny_models)
    run_turn(session, FIRST)
    turn1 = session.records[0]
    # Three tokens: the prompt's round drafts nothing, then exactly one draft step, whose
    # decode is the part of the prompt the drafter lacks plus the first reply token. It
    # holds turn 1 but for at most the reply's last two tokens (the last draft token and
    # the target's bonus token are never fed to the drafter).
    session.settings = GenerationSettings(max_tokens=3)
    run_turn(session, SECOND)
    turn2 = session.records[1]
    new = turn2.prompt_tokens - (turn1.prompt_tokens + turn1.reply_tokens - 1)
    assert 0 < turn2.drafter_decoded <= new + 2 < 40


def test_reset_forgets_the_conversation(tiny_models):
    session = new_session(tiny_models, system="be brief")
    first = run_turn(session, FIRST)
    run_turn(session, SECOND)
    session.reset()
    assert session.messages() == [{"role": "system", "content": "be brief"}]
    again = run_turn(session, FIRST)
    assert again.text == first.text
    assert session.records[2].prompt_tokens == session.records[0].prompt_tokens


def test_a_long_conversation_drops_the_oldest_turns_and_keeps_the_system_message(tiny_models):
    session = new_session(tiny_models, ctx=256, system="be brief", max_tokens=40)
    n_ctx = session.pair.target.n_ctx
    rendered = session.pair.target.format_chat([{"role": "system", "content": "be brief"}])
    system_turn = rendered[: rendered.index("<|im_end|>") + len("<|im_end|>")]
    system_prefix = encode_template_text(session.pair.target, system_turn)
    for i in range(10):
        turn = session.reply(f"message number {i} about the model and the data")
        list(turn.events())
        assert turn.generation.prompt[: len(system_prefix)] == system_prefix
        assert turn.record.prompt_tokens + turn.record.reply_tokens <= n_ctx
    assert sum(r.dropped_exchanges for r in session.records) > 0
    assert session.messages()[0] == {"role": "system", "content": "be brief"}
    assert len(session.exchanges) == 10  # the transcript keeps what the window dropped
    assert session.window_start > 0


def test_a_message_longer_than_the_context_is_refused_and_the_session_goes_on(tiny_models):
    session = new_session(tiny_models, ctx=256)
    run_turn(session, FIRST)
    with pytest.raises(ContextOverflowError):
        session.reply("the data " * 200)
    assert len(session.exchanges) == 1
    run_turn(session, SECOND)
    assert len(session.exchanges) == 2


def test_stopping_mid_reply_keeps_the_partial_answer(tiny_models):
    session = new_session(tiny_models, max_tokens=200)
    turn = session.reply(FIRST)
    events = turn.events()
    pieces = []
    for event in events:
        if isinstance(event, Piece) and event.text:
            pieces.append(event)
            if len(pieces) == 5:
                break
    events.close()
    finished = turn.stop()
    assert finished.finish_reason == "interrupted"
    assert session.exchanges[-1].assistant == "".join(p.text for p in pieces)
    assert session.exchanges[-1].interrupted
    run_turn(session, SECOND)
    record = session.records[-1]
    first_prompt = session.records[0].prompt_tokens
    assert record.prompt_tokens > first_prompt + len(finished.tokens)  # the partial reply is kept
    assert_exact_reuse(record.reused_tokens, first_prompt, record.prompt_tokens)


def test_draft_and_temperature_commands(tiny_models):
    session = new_session(tiny_models)
    session.set_draft_max(0)
    assert not session.drafting
    assert run_turn(session, FIRST).stats.drafted == 0
    session.set_draft_max(3)
    assert max(run_turn(session, SECOND).stats.draft_lengths) == 3
    session.set_temperature(0.8)
    assert session.settings.sampling.temperature == 0.8
    alone = new_session(tiny_models, drafter=False)
    with pytest.raises(CommandError):
        alone.set_draft_max(3)


def test_save_writes_json_and_markdown(tiny_models, tmp_path):
    session = new_session(tiny_models, system="be brief")
    first = run_turn(session, FIRST)
    record = json.loads(session.save(tmp_path / "chat.json").read_text())
    assert record["system"] == "be brief"
    assert record["messages"] == [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": first.text},
    ]
    assert record["totals"]["generated_tokens"] == len(first.tokens)
    markdown = session.save(tmp_path / "chat.md").read_text()
    assert "**System:** be brief" in markdown
    assert f"## You\n\n{FIRST}\n\n## Assistant\n\n{first.text}\n" in markdown


def test_a_model_without_a_chat_template_is_refused(tiny_models):
    pair = load_pair(tiny_models.close_drafter, None, HardwareOptions(ctx_size=256, threads=1))
    with pytest.raises(ModelFileError, match="chat template"):
        ChatSession(pair, GenerationSettings())


# ---- scripted mode: stdin is not a terminal ---------------------------------------------------


def test_scripted_mode_prints_plain_replies_one_per_line(tiny_models):
    session = new_session(tiny_models)
    expected = [run_turn(session, FIRST).text, run_turn(session, SECOND).text]
    assert all("\n" not in text for text in expected)

    result = CliRunner().invoke(
        app,
        ["chat", "-t", str(tiny_models.target), "-d", str(tiny_models.close_drafter)]
        + ["--drafter", "fixed", "--threads", "1", "-n", "30"],
        input=f"{FIRST}\n\n{SECOND}\n",
        env={"TERM": "xterm-256color", "FORCE_COLOR": "1"},
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "".join(f"{text}\n" for text in expected)
    assert "\x1b" not in result.stdout and "\x1b" not in result.stderr


def test_scripted_mode_runs_commands_and_reports_bad_ones(tiny_models, tmp_path):
    result = CliRunner().invoke(
        app,
        ["chat", "-t", str(tiny_models.target), "--no-draft", "--threads", "1", "-n", "5"],
        input=f"{FIRST}\n/draft x\n/save {tmp_path / 'chat.json'}\n/exit\n{SECOND}\n",
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1  # /exit came before the second message
    assert "/draft needs a whole number" in result.stderr
    assert json.loads((tmp_path / "chat.json").read_text())["messages"][0]["content"] == FIRST


def test_predict_drafts_the_next_answer_only(tiny_models, tmp_path):
    from specdec_cli.decoding.costs import CostModel
    from specdec_cli.decoding.modes import build_drafter

    pair = load_pair(tiny_models.target, None, HardwareOptions(ctx_size=1024, threads=1))
    costs = CostModel({1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.0, learn=False)
    drafter = build_drafter("ngram", pair.target, None, costs=costs)
    session = ChatSession(pair, GenerationSettings(max_tokens=30), drafter=drafter)
    expected = run_turn(session, FIRST)
    session.reset()
    prediction = tmp_path / "expected.txt"
    prediction.write_text(expected.text)
    assert session.predict(str(prediction)) > 0
    predicted = run_turn(session, FIRST)
    assert predicted.text == expected.text  # the answer is the target's, predicted or not
    assert predicted.stats.accepted_prediction_tokens > 0
    session.reset()
    again = run_turn(session, FIRST)  # the prediction was for one answer only
    assert again.stats.accepted_prediction_tokens == again.stats.rejected_prediction_tokens == 0


def test_predict_with_a_missing_file_says_so(tiny_models, tmp_path):
    session = new_session(tiny_models, drafter=False)
    with pytest.raises(BadUsageError, match="cannot read the prediction"):
        session.predict(str(tmp_path / "nope.txt"))


def test_after_a_reset_the_same_question_drafts_from_the_earlier_answer(tiny_models, tmp_path):
    from specdec_cli.decoding.costs import CostModel
    from specdec_cli.decoding.modes import build_drafter
    from specdec_cli.services.history_file import HistoryFile

    pair = load_pair(tiny_models.target, None, HardwareOptions(ctx_size=1024, threads=1))
    costs = CostModel({1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.0, learn=False)
    drafter = build_drafter("ngram", pair.target, None, costs=costs)
    file = HistoryFile(tmp_path, "vocab")
    session = ChatSession(pair, GenerationSettings(max_tokens=30), drafter=drafter)
    session.history_file = file
    first = run_turn(session, FIRST)
    session.reset()  # the conversation is gone; what the model wrote is still known
    again = run_turn(session, FIRST)
    assert again.text == first.text
    assert first.stats.draft_sources["history"] == 0 < again.stats.draft_sources["history"]
    # Each turn stored once: the first with its question, the second (the same question
    # after the reset, shared with the turn before) only its answer.
    stored = [list(d) for d in file.load()[0].documents()]
    assert len(stored) == 2 and stored[1] == again.tokens
    assert stored[0][-len(first.tokens) :] == first.tokens and len(stored[0]) > len(first.tokens)


# ---- /schema and /grammar: answers under a constraint ----------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_schema_makes_every_answer_match_until_it_is_lifted(tiny_models, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    drafted = new_session(tiny_models, max_tokens=60)
    alone = new_session(tiny_models, drafter=False, max_tokens=60)
    answers = []
    for session in (drafted, alone):
        session.constrain("schema", str(schema))
        answers.append([run_turn(session, FIRST), run_turn(session, SECOND)])
    for finished in answers[0]:
        person = json.loads(finished.text)
        assert list(person) == ["name", "age"] and isinstance(person["age"], int), finished.text
    assert [f.tokens for f in answers[0]] == [f.tokens for f in answers[1]]  # the target's own
    drafted.constrain("schema", None)
    assert not run_turn(drafted, FIRST).text.lstrip().startswith("{")  # free again


def test_a_schema_or_grammar_that_cannot_be_used_is_refused_and_the_session_goes_on(
    tiny_models, tmp_path
):
    broken = tmp_path / "broken.gbnf"
    broken.write_text('root ::= "a" missing-rule\n')
    result = CliRunner().invoke(
        app,
        ["chat", "-t", str(tiny_models.target), "--no-draft", "--threads", "1", "-n", "5"],
        input=f"/schema {tmp_path / 'nope.json'}\n/grammar {broken}\n{FIRST}\n",
    )
    assert result.exit_code == 0, result.output
    assert "/schema: cannot read" in result.stderr
    assert "could not parse the grammar" in result.stderr
    assert len(result.stdout.splitlines()) == 1  # the message is still answered, freely
