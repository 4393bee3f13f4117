"""`specdec run` end to end on tiny GGUF models: output, JSON, errors and exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.policy import ADAPTIVE_DRAFT_LIMIT
from specdec_cli.llama.library import EXACT_BATCH_ROWS
from specdec_cli.paths import cache_dir

runner = CliRunner()
PROMPTS = ["the cat sat on", "one two three four", "what is the time"]


def invoke(args: list[str], stdin: str = "") -> object:
    return runner.invoke(app, args, input=stdin)


def run_json(tiny_models, prompt: str, *extra: str) -> dict:
    args = ["run", prompt, "--raw", "--target", str(tiny_models.target), "--json", *extra]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_output_equals_the_target_alone(tiny_models, prompt):
    drafter = str(tiny_models.close_drafter)
    plain = run_json(tiny_models, prompt, "--no-draft", "-n", "48")
    fixed = run_json(tiny_models, prompt, "--draft", drafter, "--drafter", "fixed", "-n", "48")
    assert fixed["tokens"] == plain["tokens"]
    assert fixed["text"] == plain["text"]
    assert fixed["stats"]["accepted"] > 0
    assert plain["stats"]["drafted"] == 0
    for mode in ("combined", "model", "ngram"):
        model = ("--draft", drafter) if mode != "ngram" else ()
        adaptive = run_json(tiny_models, prompt, *model, "--drafter", mode, "-n", "48")
        assert adaptive["tokens"] == plain["tokens"], mode


@pytest.fixture
def timings_pass_their_checks(monkeypatch):
    """A millisecond model's timings on a busy machine fail the probe's checks, and then the
    table is rightly neither cached nor written back (test_adaptive tests the checks). The
    tests that follow a table into the cache take every table as trusted instead, so they
    do not depend on what else runs (they failed while a download hashed on the other core)."""
    from specdec_cli.decoding import costs
    from specdec_cli.services import cost_cache

    monkeypatch.setattr(costs, "probe_problems", lambda timings: [])
    monkeypatch.setattr(cost_cache, "table_problems", lambda table: [])


@pytest.mark.usefixtures("timings_pass_their_checks")
def test_measured_decode_costs_go_to_the_tests_own_cache(tiny_models, monkeypatch):
    from conftest import point_caches_at_the_users

    home = cache_dir()
    with monkeypatch.context() as users:
        point_caches_at_the_users(users)
        assert cache_dir() != home
    run_json(tiny_models, "the cat", "--draft", str(tiny_models.close_drafter), "-n", "4")
    assert (home / "decode-costs.json").is_file()


@pytest.mark.usefixtures("timings_pass_their_checks")
def test_json_shows_the_cost_table_and_the_next_run_starts_from_what_this_one_measured(
    tiny_models,
):
    drafter = str(tiny_models.close_drafter)
    first = run_json(tiny_models, "one two three four", "--draft", drafter, "-n", "120")
    costs = first["costs"]
    assert costs["origin"].startswith("probe")
    assert (
        set(costs["started"])
        == set(costs["now"])
        == {"target_decode_ms", "draft_step_ms", "catch_up"}
    )
    assert sum(costs["observed"].values()) >= 16
    second = run_json(tiny_models, "one two three four", "--draft", drafter, "-n", "4")
    assert second["costs"]["origin"] == "cache (learned)"
    assert second["costs"]["started"] == costs["now"]
    assert run_json(tiny_models, "the cat", "--no-draft", "-n", "2")["costs"] is None
    alone = run_json(tiny_models, "the cat", "--drafter", "none", "-n", "2")
    assert alone["costs"] is None and alone["stats"]["drafted"] == 0
    assert alone["settings"]["drafter"] == "none"


def test_the_cost_line_says_how_far_the_run_moved_each_cost():
    from specdec_cli.render import costs_summary

    line = costs_summary(
        {
            "origin": "cache (probe)",
            "started": {"target_decode_ms": {"1": 46.0, "2": 180.0}, "draft_step_ms": 20.0},
            "now": {"target_decode_ms": {"1": 46.2, "2": 60.0}, "draft_step_ms": 21.0},
            "observed": {"1": 30, "3": 2},
        }
    )
    assert line == (
        "decode costs, ms by tokens (cache (probe); 32 decodes timed): "
        "1: 46 · 2: 180→60 · drafter step 20→21"
    )
    catch_up = {"fixed_ms": 2.183, "token_ms": 0.0325}
    with_catch_up = costs_summary(
        {
            "origin": "probe",
            "started": {"target_decode_ms": {"1": 3.8}, "draft_step_ms": 1.2},
            "now": {"target_decode_ms": {"1": 3.8}, "draft_step_ms": 1.2, "catch_up": catch_up},
            "observed": {},
        }
    )
    assert with_catch_up.endswith("drafter step 1 · catch-up 2.2 + 0.03 a token")


def test_json_record_is_complete_and_consistent(tiny_models):
    record = run_json(
        tiny_models,
        "the cat",
        "--draft",
        str(tiny_models.close_drafter),
        "--drafter",
        "fixed",
        "-n",
        "40",
    )
    stats = record["stats"]
    assert set(record) >= {"text", "tokens", "finish_reason", "stats", "settings"}
    assert record["finish_reason"] == "length"
    assert stats["generated_tokens"] == len(record["tokens"]) == 40
    assert 0 <= stats["accepted"] <= stats["drafted"]
    assert stats["tokens_per_pass"] == pytest.approx(40 / stats["target_passes"], abs=1e-3)
    assert stats["acceptance"] == pytest.approx(stats["accepted"] / stats["drafted"], abs=1e-3)
    assert record["settings"]["draft_max"] == 8  # the fixed mode's default
    assert record["settings"]["sampling"]["temperature"] == 0.0


def test_verify_reports_identical_output(tiny_models):
    record = run_json(
        tiny_models, "the cat", "--draft", str(tiny_models.close_drafter), "-n", "32", "--verify"
    )
    assert record["verify"]["identical"] is True
    assert record["verify"]["target_alone"]["generated_tokens"] == 32


@pytest.mark.parametrize("mode", ["fixed", "combined"])
def test_a_drafter_of_another_vocabulary_drafts_by_text(tiny_models, mode):
    plain = run_json(tiny_models, PROMPTS[0], "--no-draft", "-n", "32")
    other = str(tiny_models.incompatible)
    drafted = run_json(tiny_models, PROMPTS[0], "--draft", other, "--drafter", mode, "-n", "32")
    assert drafted["text"] == plain["text"]
    assert drafted["tokens"] == plain["tokens"]
    if mode == "fixed":  # every round drafts, by text
        assert drafted["stats"]["draft_sources"].get("text", 0) > 0
        assert "model" not in drafted["stats"]["draft_sources"]


def test_force_uses_an_incompatible_drafter_anyway(tiny_models):
    # By token ids all the same (source "model"), not by text (source "text"), and it drafts.
    incompatible = str(tiny_models.incompatible)
    record = run_json(tiny_models, "hi", "-n", "8", "--draft", incompatible, "--drafter", "fixed",
                      "--force")  # fmt: skip
    sources = record["stats"]["draft_sources"]
    assert record["stats"]["drafted"] > 0 and sources.get("model", 0) > 0 and "text" not in sources
    by_text = run_json(tiny_models, "hi", "-n", "8", "--draft", incompatible, "--drafter", "fixed")
    assert by_text["stats"]["draft_sources"].get("text", 0) > 0  # the control: without --force


def test_missing_model_file(tiny_models, tmp_path):
    result = invoke(["run", "hi", "--target", str(tmp_path / "none.gguf"), "--no-draft"])
    assert result.exit_code == 1
    assert "does not exist" in result.stderr


def test_a_library_folder_without_llama_cpp_is_one_line_naming_it(tiny_models, tmp_path):
    """LLAMA_CPP_LIB_PATH (a native build of one's own) naming a folder with no libllama.so
    is what is wrong, said in one line, not llama-cpp-python's traceback."""
    args = ["run", "hi", "--raw", "--target", str(tiny_models.target), "--no-draft"]
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert f"LLAMA_CPP_LIB_PATH='{tmp_path}'" in lines[0]
    assert done.stdout == b""


def test_no_prompt_is_bad_usage(tiny_models):
    result = invoke(["run", "--target", str(tiny_models.target), "--no-draft"])
    assert result.exit_code == 2
    assert "no prompt" in result.stderr


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench"])
def test_help_is_readable_at_80_columns(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    options = [line for line in lines if line.lstrip().startswith("-")]
    assert len(options) > 10, result.output
    for line in options:
        name, gap, text = line.strip().partition("  ")
        if text:  # on the option's own line, the description starts in the first 32 columns
            assert line.index(text.lstrip()) <= 32, line


def test_unknown_option_is_bad_usage():
    assert invoke(["run", "--no-such-option"]).exit_code == 2


def test_piped_stdin_comes_after_the_argument(tiny_models):
    args = [
        "run",
        "Summarise:",
        "--raw",
        "--no-draft",
        "-n",
        "4",
        "--json",
        "--target",
        str(tiny_models.target),
    ]
    piped = json.loads(invoke(args, stdin="the cat sat on the mat").stdout)
    joined = run_json(tiny_models, "Summarise:\n\nthe cat sat on the mat", "--no-draft", "-n", "4")
    alone = run_json(tiny_models, "Summarise:", "--no-draft", "-n", "4")
    assert piped["stats"]["prompt_tokens"] == joined["stats"]["prompt_tokens"]
    assert piped["tokens"] == joined["tokens"]
    assert alone["stats"]["prompt_tokens"] < joined["stats"]["prompt_tokens"]


def test_prompt_longer_than_the_context(tiny_models):
    result = invoke(
        [
            "run",
            "the cat " * 200,
            "--raw",
            "--no-draft",
            "--ctx-size",
            "64",
            "--target",
            str(tiny_models.target),
        ]
    )
    assert result.exit_code == 1
    assert "the prompt is" in result.stderr and "context holds" in result.stderr
    assert "--ctx-size" in result.stderr


def test_the_default_context_ends_at_the_models_trained_length(tiny_models):
    prompt = "the cat " * 150  # 452 tokens; tiny_gguf's models are trained on 512
    room = run_json(tiny_models, prompt, "--no-draft", "-n", "100", "--ctx-size", "1024")
    assert room["finish_reason"] == "length"
    capped = run_json(tiny_models, prompt, "--no-draft", "-n", "100")
    stats = capped["stats"]
    assert capped["finish_reason"] == "context"
    assert stats["prompt_tokens"] + stats["generated_tokens"] == 512


def test_stop_string_cuts_the_answer(tiny_models):
    full = run_json(tiny_models, "the cat", "--no-draft", "-n", "40")["text"]
    stop = full[10:13]
    cut = run_json(tiny_models, "the cat", "--no-draft", "-n", "40", "--stop", stop)
    assert cut["finish_reason"] == "stop_string"
    assert cut["text"] == full[: full.index(stop)]


def test_chat_template_is_used_unless_raw(tiny_models):
    templated = run_json(tiny_models, "hi", "--no-draft", "-n", "2")
    args = ["run", "hi", "--no-draft", "-n", "2", "--json", "--target", str(tiny_models.target)]
    chat = json.loads(invoke(args).stdout)
    assert chat["stats"]["prompt_tokens"] > templated["stats"]["prompt_tokens"]


def _specdec(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "specdec_cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        **kwargs,
    )


def test_streamed_stdout_is_valid_utf8_when_characters_span_tokens(tmp_path):
    target = write_tiny_llama(tmp_path / "t.gguf", seed=3, byte_scale=4.0)
    drafter = write_tiny_llama(
        tmp_path / "d.gguf", seed=5, perturb_from=3, noise=0.02, byte_scale=4.0
    )
    common = ["run", "hello", "--raw", "-n", "40", "--target", str(target), "--draft", str(drafter)]
    streamed = _specdec(*common).communicate(timeout=120)[0]
    record = json.loads(_specdec(*common, "--json").communicate(timeout=120)[0])
    text = streamed.decode("utf-8")  # strict: raises on a split character
    assert text == record["text"] + "\n"
    assert any(ord(c) > 127 and c != "\ufffd" for c in text)  # a multi-byte character made it


def _endless_run(tmp_path):
    """specdec run on a target that never ends its answer (its EOS logit is always 0, far
    below the likeliest token's), so a test's signal always lands mid-answer."""
    target = write_tiny_llama(tmp_path / "endless.gguf", seed=0, eos_scale=0.0)
    args = ["run", "the cat", "--raw", "-n", "100000", "--ctx-size", "32768"]
    return _specdec(*args, "--target", str(target), "--drafter", "ngram")


def test_a_reader_that_goes_away_ends_the_run_quietly_with_sigpipes_status(tmp_path):
    process = _endless_run(tmp_path)
    assert len(process.stdout.read(8)) == 8  # like `| head -c 8`
    process.stdout.close()
    process.wait(timeout=60)  # generating 100000 tokens would take far longer
    assert process.returncode == 141
    assert process.stderr.read() == b""


def test_ctrl_c_keeps_the_partial_answer_and_exits_130(tmp_path):
    process = _endless_run(tmp_path)
    first = process.stdout.read(8)  # the answer is streaming: Ctrl-C now
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert len(first + rest) > 8
    assert b"interrupted" in stderr


def test_an_unknown_rule_is_refused_before_any_model_is_looked_up():
    result = invoke(["run", "hi", "--target", "no-such-model", "--rule", "bogus"])
    assert result.exit_code == 2
    assert "--rule" in result.output and "no-such-model" not in result.output


def test_a_draft_longer_than_the_exact_batch_limit_is_refused():
    # Exact mode verifies at most EXACT_BATCH_ROWS tokens with the batch-invariant kernels;
    # a longer draft would be checked by other kernels and could change the answer.
    result = invoke(["run", "hi", "--target", "no-such-model", "--draft-max", "64"])
    assert result.exit_code == 2
    assert "--draft-max" in result.output and "no-such-model" not in result.output
    assert ADAPTIVE_DRAFT_LIMIT + 1 <= EXACT_BATCH_ROWS


def test_history_is_kept_only_when_asked_and_later_runs_load_it(tiny_models, tmp_path):
    folder = tmp_path / "history"
    args = ("--drafter", "ngram", "-n", "32", "--history", str(folder))
    first = run_json(tiny_models, "one two three four", *args)
    second = run_json(tiny_models, "one two three four", *args)
    plain = run_json(tiny_models, "one two three four", "--no-draft", "-n", "32")
    assert first["text"] == second["text"] == plain["text"]
    assert first["history"] == {"documents": 0} and second["history"] == {"documents": 1}
    assert plain["history"] is None
    # (Whether a history draft pays depends on the measured costs: drafting from it is
    # tested with fixed costs in test_history, test_chat and test_model_thread.)
    [stored] = list(folder.glob("*.jsonl"))
    assert len(stored.read_text().splitlines()) == 2
    # Without --history (and no SPECDEC_HISTORY) nothing is written anywhere.
    before = sorted(p for p in cache_dir().rglob("*") if p.suffix == ".jsonl")
    run_json(tiny_models, "one two three four", "--drafter", "ngram", "-n", "8")
    assert sorted(p for p in cache_dir().rglob("*") if p.suffix == ".jsonl") == before


def test_a_damaged_history_line_is_one_warning_and_the_run_goes_on(tiny_models, tmp_path):
    folder = tmp_path / "history"
    run_json(tiny_models, "the cat", "--drafter", "ngram", "-n", "8", "--history", str(folder))
    [stored] = list(folder.glob("*.jsonl"))
    with open(stored, "a") as out:
        out.write('{"tokens": [1, 2\n')
    result = invoke(["run", "the cat", "--raw", "--target", str(tiny_models.target), "--drafter",
                     "ngram", "-n", "8", "--history", str(folder)])  # fmt: skip
    assert result.exit_code == 0
    assert "skipped 1 damaged line" in result.stderr


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--draft", "small", "--no-draft"], "--draft and --no-draft contradict"),
        (["--draft", "small", "--drafter", "ngram"], "--draft would be ignored"),
        (["--draft", "small", "--drafter", "none"], "--drafter none is the target alone"),
    ],
)
def test_options_that_would_be_silently_ignored_are_refused_first(command, flags, said):
    args = [command, *(["hi"] if command == "run" else []), "--target", "no-such-model", *flags]
    result = invoke(args)
    assert result.exit_code == 2
    assert said in result.output and "no-such-model" not in result.output
