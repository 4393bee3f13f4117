"""`specdec bench`: prompt files, statistics, and the JSON report on tiny GGUF pairs.

No test here asserts a speed: tiny models on a shared CPU time as noise. They check that
every field is filled and that the numbers agree with each other.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from bench_requests import bench_request
from typer.testing import CliRunner

from specdec_cli.bench import bench, bench_configs, bench_prompts, bench_report, bench_stats
from specdec_cli.decoding.engine import FinishReason, GenerationStats
from specdec_cli.decoding.modes import DrafterMode
from specdec_cli.decoding.policy import ADAPTIVE_DRAFT_LIMIT
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.decoding.verification import SamplingRule
from specdec_cli.errors import BadUsageError, ContextOverflowError
from specdec_cli.models.checksums import cached_sha256
from specdec_cli.request import HardwareOptions

runner = CliRunner()
drafters = bench_configs.parse_drafters

PROMPTS_YAML = """\
prompts:
  - id: greet
    category: prose
    text: hello world the code
    max_tokens: 12
  - id: chat
    category: code
    messages:
      - {role: system, content: you write code}
      - {role: user, content: def hello world}
    max_tokens: 10
  - id: short
    category: code
    text: print the list
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- prompts ------------------------------------------------------------------------------


def test_builtin_suite_covers_the_categories():
    prompts = bench_prompts.load_prompts()
    by_category: dict[str, list[bench_prompts.BenchPrompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    assert len(prompts) >= 16
    assert set(by_category) == {"code", "structured", "editing", "summarising", "prose", "qa"}
    assert all(len(group) >= 2 for group in by_category.values())
    short = [p for p in prompts if p.prediction is None]
    assert all(p.max_tokens == 128 for p in short)
    for p in by_category["editing"] + by_category["summarising"]:
        assert len(p.text) > 300, f"{p.id} should carry a passage"


def test_builtin_suite_has_long_edits_with_their_predictions():
    predicted = [p for p in bench_prompts.load_prompts() if p.prediction is not None]
    edits = [p for p in predicted if p.category == "editing"]
    assert len(edits) >= 4 and len([p for p in predicted if p.category == "structured"]) >= 2
    for p in edits:
        assert 40 <= len(p.prediction.splitlines()) <= 150, p.id
    for p in predicted:
        assert p.prediction in p.text, f"{p.id}: the prediction is the text being edited"


def test_yaml_and_jsonl_prompt_files(tmp_path):
    from_yaml = bench_prompts.load_prompts(write(tmp_path, "p.yaml", PROMPTS_YAML))
    assert [p.id for p in from_yaml] == ["greet", "chat", "short"]
    assert from_yaml[1].messages[0] == {"role": "system", "content": "you write code"}
    assert from_yaml[2].max_tokens == bench_prompts.DEFAULT_MAX_TOKENS
    lines = [
        {"id": "j1", "category": "qa", "text": "why", "max_tokens": 5},
        {"id": "j2", "category": "qa", "messages": [{"role": "user", "content": "hi"}]},
    ]
    jsonl = write(tmp_path, "p.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    loaded = bench_prompts.load_prompts(jsonl)
    assert [(p.id, p.max_tokens) for p in loaded] == [("j1", 5), ("j2", 128)]


@pytest.mark.parametrize(
    ("name", "text", "complaint"),
    [
        ("bad.yaml", "prompts: [1\n", "not valid YAML"),
        ("bad.yaml", "just a string\n", "expected a list"),
        ("bad.yaml", "prompts: []\n", "holds no prompts"),
        ("bad.yaml", "- {category: qa, text: hi}\n", "'id' must be a non-empty string"),
        ("bad.yaml", "- {id: a, text: hi}\n", "'category'"),
        ("bad.yaml", "- {id: a, category: qa}\n", "exactly one of 'text' and 'messages'"),
        ("bad.yaml", "- {id: a, category: qa, text: hi, messages: []}\n", "exactly one"),
        ("bad.yaml", "- {id: a, category: qa, text: hi, max_tokens: 0}\n", "max_tokens"),
        ("bad.yaml", "- {id: a, category: qa, text: hi, max_token: 9}\n", "unknown field"),
        ("bad.yaml", "- {id: a, category: qa, messages: [{role: user}]}\n", "each message"),
        (
            "bad.yaml",
            "- {id: a, category: qa, messages: [{role: user, content: x, tool_calls: [1]}]}\n",
            "each message",
        ),
        ("bad.yaml", "- {id: a, category: qa, text: hi, warm: true}\n", "only with a 'session'"),
        ("bad.yaml", "- {id: a, category: qa, text: hi, session: s, warm: 1}\n", "'warm'"),
        ("bad.yaml", "- {id: a, category: qa, text: hi, tool_choice: auto}\n", "only with 'tools'"),
        (
            "bad.yaml",
            "- {id: a, category: qa, text: x}\n- {id: a, category: qa, text: y}\n",
            "used twice",
        ),
        ("bad.jsonl", '{"id": "a", "category": "qa", "text": "x"}\n{"id": \n', "line 2"),
    ],
)
def test_malformed_prompt_file_is_a_clear_error(tmp_path, name, text, complaint):
    path = write(tmp_path, name, text)
    with pytest.raises(BadUsageError) as caught:
        bench_prompts.load_prompts(path)
    assert complaint in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(BadUsageError, match="cannot read"):
        bench_prompts.load_prompts(tmp_path / "nope.yaml")


def test_category_filter_and_per_category():
    prompts = bench_prompts.load_prompts()
    code = bench_prompts.select_prompts(prompts, ["code"])
    assert code and {p.category for p in code} == {"code"}
    two = bench_prompts.select_prompts(prompts, ["code,qa"], per_category=1)
    assert [p.category for p in two] == ["code", "qa"]
    with pytest.raises(BadUsageError, match="poetry"):
        bench_prompts.select_prompts(prompts, ["poetry"])


def test_draft_max_list_and_configurations():
    assert bench_configs.parse_int_list("2,4,8", "--draft-max") == [2, 4, 8]
    for bad in ("", "a", "2,,x", "0,2"):
        with pytest.raises(BadUsageError, match="--draft-max"):
            bench_configs.parse_int_list(bad, "--draft-max")
    with pytest.raises(BadUsageError, match="longest draft, 63"):
        bench_configs.parse_int_list("8,64", "--draft-max", largest=63)
    configs = bench_configs.configurations([4, 2, 4], drafters("model"))
    assert [(c.label, c.draft_max) for c in configs] == [("model k=4", 4), ("model k=2", 2)]
    with pytest.raises(BadUsageError, match="unknown drafter"):
        drafters("telepathy")


# --- statistics -----------------------------------------------------------------------------


def test_speedup_estimate():
    assert bench_stats.speedup_estimate([]) is None
    constant = bench_stats.speedup_estimate([[2.0, 2.0, 2.0], [0.5, 0.5]])
    assert constant.value == pytest.approx(1.0)
    assert constant.low == pytest.approx(1.0) and constant.high == pytest.approx(1.0)
    groups = [[1.1, 1.5, 1.3], [2.0, 1.8, 2.4], [0.9, 1.0, 1.2]]
    estimate = bench_stats.speedup_estimate(groups)
    expected = bench_stats.geometric_mean([1.3, 2.0, 1.0])
    assert estimate.value == pytest.approx(expected)
    assert estimate.low <= estimate.value <= estimate.high
    assert bench_stats.speedup_estimate(groups) == estimate  # a fixed seed: the same interval


def test_sha256_is_cached(tmp_path, monkeypatch):
    model = write(tmp_path, "m.gguf", "GGUF and some bytes")
    cache = tmp_path / "sha.json"
    digest = cached_sha256(model, cache)
    assert digest == hashlib.sha256(model.read_bytes()).hexdigest()

    def no_rehash(path):
        raise AssertionError("hashed twice")

    monkeypatch.setattr("specdec_cli.models.checksums.sha256_of", no_rehash)
    assert cached_sha256(model, cache) == digest


# --- end to end on tiny GGUF pairs --------------------------------------------------------------


def bench_args(tiny_models, prompts: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--target",
        str(tiny_models.target),
        "--draft",
        str(tiny_models.close_drafter),
        "--prompts",
        str(prompts),
        "--ctx-size",
        "512",
        "--warmup",
        "4",
        "--fast",
        *extra,
    ]


@pytest.fixture(scope="module")
def sweep(tiny_models, tmp_path_factory):
    """One bench: three prompts, draft lengths 2 and 4, two repeats, JSON and Markdown."""
    tmp = tmp_path_factory.mktemp("bench")
    prompts = write(tmp, "prompts.yaml", PROMPTS_YAML)
    out, md = tmp / "bench.json", tmp / "bench.md"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(tmp / "home"))
        result = runner.invoke(
            app(),
            bench_args(
                tiny_models,
                prompts,
                "--draft-max",
                "2,4",
                "--drafter",
                "fixed",
                "--repeats",
                "2",
                "--json",
                str(out),
                "--markdown",
                str(md),
            ),
        )
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), md.read_text(), result


def app():
    from specdec_cli.cli import app

    return app


def test_report_is_complete_and_honours_the_prompts_file(sweep, tiny_models):
    report, _, _ = sweep
    assert report["schema"] == bench_report.SCHEMA
    assert report["complete"] is True and report["missing"] == [] and report["stopped_by"] is None
    assert report["settings"]["prompt_ids"] == ["greet", "chat", "short"]
    assert report["settings"]["repeats"] == 2
    assert [c["draft_max"] for c in report["settings"]["configurations"]] == [2, 4]
    assert {p["name"] for p in report["prompts"]} == {"greet", "chat", "short"}
    assert report["summary"]["runs_planned"] == report["summary"]["runs_measured"] == 3 * 2 * 3
    for role, path in (("target", tiny_models.target), ("draft", tiny_models.close_drafter)):
        model = report["models"][role]
        assert model["sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
        assert model["size_bytes"] == Path(path).stat().st_size and model["parameters"] > 0
    machine = report["machine"]
    for key in (
        "cpu",
        "cpu_count",
        "threads",
        "llama_cpp_python",
        "llama_cpp_system_info",
        "gpu_layers",
        "ctx_size",
    ):
        assert machine[key] not in (None, ""), key
    assert report["started_at"] and report["finished_at"]


def test_sweep_gives_one_row_per_draft_length(sweep):
    report, markdown, result = sweep
    labels = ["fixed k=2", "fixed k=4"]
    for prompt in ("greet", "chat", "short"):
        rows = [r for r in report["prompts"] if r["name"] == prompt]
        assert [r["configuration"] for r in rows] == labels
    assert sorted({r["name"] for r in report["categories"]}) == ["code", "prose"]
    assert [r["configuration"] for r in report["categories"] if r["name"] == "code"] == labels
    assert [r["configuration"] for r in report["summary"]["configurations"]] == labels
    assert report["summary"]["best_configuration"] in labels
    assert set(report["summary"]["best_per_category"]) == {"code", "prose"}
    for prompt in ("greet", "chat", "short"):
        assert f"| {prompt} |" in markdown
    assert "geometric-mean speedup" in result.output


def sides(row):
    return row["target_alone"], row["speculative"]


def test_every_number_is_filled_and_consistent(sweep):
    report, _, _ = sweep
    rows = report["prompts"] + report["categories"] + report["summary"]["configurations"]
    for row in rows:
        alone, spec = sides(row)
        assert alone["drafted"] == 0 and spec["drafted"] > 0
        for side in (alone, spec):
            assert side["runs"] > 0
            assert 0 <= side["accepted"] <= side["drafted"]
            decided = side["generated_tokens"] + side["end_tokens"]
            assert side["tokens_per_pass"] == pytest.approx(
                decided / side["target_passes"], abs=1e-3
            )
            assert side["tokens_per_second"] > 0 and side["first_token_seconds"] > 0
            split = side["time_split"]
            assert sum(split.values()) == pytest.approx(1.0, abs=2e-3)
            assert 0 < side["decode_seconds"] < side["seconds"]
            host = 1 - side["decode_seconds"] / side["seconds"]
            rounding = 1e-4 / side["seconds"] + 1e-4  # both seconds given to 0.1 ms
            assert side["host_share"] == pytest.approx(host, abs=rounding)
            assert sum(side["draft_lengths"].values()) == side["target_passes"]
        assert spec["acceptance"] == pytest.approx(spec["accepted"] / spec["drafted"], abs=1e-3)
        assert alone["tokens_per_pass"] == 1.0
        speedup = row["speedup"]
        assert speedup["low"] <= speedup["median"] <= speedup["high"]
        assert row["compared_prompts"] == row["prompts"] > 0


def test_identical_flag_matches_the_texts(sweep):
    report, _, _ = sweep
    runs = {(r["prompt"], r["side"], r["repeat"]): r for r in report["runs"]}
    for row in report["prompts"]:
        output = row["output"]
        alone = runs[(row["name"], bench_configs.TARGET_ALONE, 0)]
        spec = runs[(row["name"], row["configuration"], 0)]
        assert output["identical"] == (alone["text"] == spec["text"])
        assert output["identical"] == (output["first_difference"] is None)
        assert output["repeats_compared"] == 2
        assert row["identical_prompts"] == int(output["identical"])
        assert row["prompt_tokens"] == alone["prompt_tokens"] > 0
        assert row["speculative"]["generated_tokens"] == sum(
            runs[(row["name"], row["configuration"], r)]["generated_tokens"] for r in (0, 1)
        )


def test_malformed_prompts_file_on_the_command_line(tiny_models, tmp_path):
    bad = write(tmp_path, "bad.yaml", "- {id: a, category: qa}\n")
    result = runner.invoke(app(), bench_args(tiny_models, bad))
    assert result.exit_code == 2
    assert "bad.yaml" in result.output and "exactly one of 'text' and 'messages'" in result.output


def test_context_overflow_writes_what_was_measured(tiny_models, tmp_path):
    prompts = write(
        tmp_path,
        "p.yaml",
        (
            "- {id: fits, category: qa, text: hello world, max_tokens: 6}\n"
            f"- {{id: huge, category: qa, text: '{'the ' * 400}', max_tokens: 6}}\n"
        ),
    )
    out = tmp_path / "partial.json"
    result = runner.invoke(
        app(),
        bench_args(tiny_models, prompts, "--ctx-size", "256", "--repeats", "1", "--json", str(out)),
    )
    assert result.exit_code == 1, result.output
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["stopped_by"].startswith("error:")
    assert {m["prompt"] for m in report["missing"]} == {"huge"}
    assert "not measured: huge" in report["missing_summary"]
    assert [p["name"] for p in report["prompts"]] == ["fits"]
    assert "bench incomplete" in result.output and str(out) in result.output


class InterruptAfter:
    """A progress listener that presses Ctrl-C after `n` tokens."""

    def __init__(self, n: int) -> None:
        self.left = n

    def stage(self, description: str, total: int | None = None) -> None:
        pass

    def advance(self, tokens: int) -> None:
        self.left -= tokens
        if self.left < 0:
            raise KeyboardInterrupt


def test_interrupt_keeps_the_finished_runs(tiny_models, tmp_path):
    prompts = bench_prompts.load_prompts(write(tmp_path, "p.yaml", PROMPTS_YAML))
    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts,
        bench_configs.configurations([3]),
        repeats=2,
        warmup_tokens=0,
        hardware=HardwareOptions(ctx_size=512),
    )
    report = bench.run_bench(request, InterruptAfter(50))  # greet: 12 x 2 x 2 tokens
    assert report.stopped_by == "interrupted" and report.exit_code == 130
    assert not report.complete
    assert 0 < len(report.runs) < len(report.planned())
    assert len(report.runs) + len(report.missing()) == len(report.planned())
    record = report.as_dict()  # summaries work on partial data
    assert record["complete"] is False and record["prompts"]
    assert "greet" not in {m["prompt"] for m in record["missing"]}


def test_sampled_runs_with_the_classic_rule_have_no_output_check(tiny_models, tmp_path):
    prompts = bench_prompts.load_prompts(write(tmp_path, "p.yaml", PROMPTS_YAML))[:1]
    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts,
        bench_configs.configurations([4]),
        repeats=1,
        warmup_tokens=0,
        sampling=SamplingSettings(temperature=0.8),
        hardware=HardwareOptions(ctx_size=512),
        rule=SamplingRule.CLASSIC,
    )
    record = bench.run_bench(request).as_dict()
    assert record["complete"] is True
    assert record["prompts"][0]["output"] is None
    assert record["prompts"][0]["compared_prompts"] == 0
    assert [r["seed"] for r in record["runs"]] == [0, 0]


def test_prompt_that_never_fits_is_an_error_before_measuring(tiny_models, tmp_path):
    prompts = bench_prompts.load_prompts(
        write(tmp_path, "p.yaml", (f"- {{id: huge, category: qa, text: '{'the ' * 400}'}}\n"))
    )
    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts,
        bench_configs.configurations([4]),
        hardware=HardwareOptions(ctx_size=256),
    )
    report = bench.run_bench(request)  # the warm-up tokenises the first prompt
    assert report.exit_code == ContextOverflowError.exit_code and not report.runs


@pytest.mark.slow  # a whole bench on the tiny models (make test-fast: a third of make test)
def test_extra_drafters_and_modes_run_in_the_same_bench(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    prompts = write(tmp_path, "prompts.yaml", PROMPTS_YAML)
    out = tmp_path / "bench.json"
    drafts = f"{tiny_models.close_drafter},{tiny_models.unrelated_drafter}"
    args = bench_args(tiny_models, prompts, "--drafter", "fixed,ngram", "--json", str(out))
    args[args.index("--draft") + 1] = drafts
    result = runner.invoke(app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    labels = [c["label"] for c in report["settings"]["configurations"]]
    ngram = f"ngram k={ADAPTIVE_DRAFT_LIMIT}"
    assert labels == ["fixed k=8", "fixed k=8 (unrelated_drafter)", ngram]
    assert set(report["models"]) == {"target", "draft", "draft:unrelated_drafter"}
    by_label = {row["configuration"]: row for row in report["summary"]["configurations"]}
    close, unrelated = by_label["fixed k=8"], by_label["fixed k=8 (unrelated_drafter)"]
    assert close["speculative"]["acceptance"] > unrelated["speculative"]["acceptance"]
    # The table the planners started from, and where the ngram runs' own decodes moved it.
    costs = report["decode_costs"]
    assert costs["started"]["target_decode_ms"] and sum(costs["observed"].values()) > 0
    assert "decode costs, ms by tokens" in result.output
    assert report["decode_costs_fast_kernels"] is None  # --fast: one kind of kernel only


def test_an_exact_bench_shows_the_decode_costs_of_both_kernels(tiny_models, tmp_path):
    prompts = write(tmp_path, "prompts.yaml", PROMPTS_YAML)
    out = tmp_path / "bench.json"
    args = bench_args(tiny_models, prompts, "--drafter", "ngram", "--per-category", "1")
    args[args.index("--fast")] = "--exact"
    result = runner.invoke(app(), [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    exact, fast = report["decode_costs"], report["decode_costs_fast_kernels"]
    assert set(fast["started"]["target_decode_ms"]) == set(exact["started"]["target_decode_ms"])
    assert "llama.cpp's kernels: decode costs, ms by tokens" in result.output


@pytest.mark.slow  # a whole bench on the tiny models (make test-fast: a third of make test)
def test_sampled_runs_with_the_invariant_rule_give_the_target_alones_answer(tiny_models, tmp_path):
    prompts = bench_prompts.load_prompts(write(tmp_path, "p.yaml", PROMPTS_YAML))[:2]
    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts,
        bench_configs.configurations([4], drafters("fixed,combined"), exact=True),
        repeats=2,
        warmup_tokens=0,
        sampling=SamplingSettings(temperature=0.8),
        hardware=HardwareOptions(ctx_size=512),
    )
    record = bench.run_bench(request).as_dict()
    exact_alone = bench_configs.EXACT_ALONE
    checked = [row for row in record["prompts"] if row["configuration"] != exact_alone]
    assert len(checked) == 2 * 2
    for row in checked:
        assert row["output"]["reference"] == bench_configs.EXACT_ALONE
        assert row["output"]["identical_repeats"] == row["output"]["repeats_compared"] == 2


@pytest.mark.slow  # a whole bench on the tiny models (make test-fast: a third of make test)
def test_exact_bench_measures_the_cost_of_exactness_and_checks_against_it(tiny_models, tmp_path):
    prompts = write(tmp_path, "prompts.yaml", PROMPTS_YAML)
    out = tmp_path / "bench.json"
    args = bench_args(tiny_models, prompts, "--drafter", "fixed,combined", "--json", str(out))
    args.remove("--fast")
    result = runner.invoke(app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    labels = [c["label"] for c in report["settings"]["configurations"]]
    assert labels == [bench_configs.EXACT_ALONE, "fixed k=8", f"combined k={ADAPTIVE_DRAFT_LIMIT}"]
    assert report["settings"]["hardware"]["exact"] is True
    rows = {row["configuration"]: row for row in report["summary"]["configurations"]}
    assert rows[bench_configs.EXACT_ALONE]["speculative"]["drafted"] == 0
    assert rows[bench_configs.EXACT_ALONE]["speedup"]["median"] > 0  # the cost of exactness
    for row in report["prompts"]:
        if row["configuration"] != bench_configs.EXACT_ALONE:
            assert row["output"]["reference"] == bench_configs.EXACT_ALONE
            assert row["output"]["identical_repeats"] == row["output"]["repeats_compared"]


def test_the_oracle_drafts_the_target_alones_answer_and_others_are_measured_against_it(
    tiny_models, tmp_path
):
    prompts = write(tmp_path, "prompts.yaml", PROMPTS_YAML)
    out = tmp_path / "bench.json"
    args = bench_args(tiny_models, prompts, "--drafter", "oracle,ngram", "--json", str(out))
    args.remove("--fast")
    result = runner.invoke(app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {row["configuration"]: row for row in report["summary"]["configurations"]}
    oracle = rows[bench_configs.ORACLE]["speculative"]
    assert oracle["drafted"] > 0 and oracle["accepted"] == oracle["drafted"]
    assert oracle["tokens_per_pass"] > 2
    assert rows[bench_configs.ORACLE]["efficiency"] == 1.0
    ngram = rows[f"ngram k={ADAPTIVE_DRAFT_LIMIT}"]
    assert ngram["efficiency"] == pytest.approx(
        ngram["speedup"]["median"] / rows[bench_configs.ORACLE]["speedup"]["median"], rel=1e-3
    )
    # instruments never win
    assert report["summary"]["best_configuration"] == f"ngram k={ADAPTIVE_DRAFT_LIMIT}"


def test_prediction_modes_use_the_prompts_prediction(tiny_models, tmp_path):
    prompts = bench_prompts.load_prompts(
        write(
            tmp_path,
            "p.yaml",
            (
                "- {id: copy, category: editing, max_tokens: 24, text: 'the cat sat',"
                " prediction: 'the cat sat on the mat and the dog sat on the log'}\n"
            ),
        )
    )
    assert prompts[0].prediction
    configurations = bench_configs.configurations(None, drafters("ngram,ngram+prediction"))
    assert [c.drafter.prediction for c in configurations] == [False, True]
    base = bench.GenerationSettings(prediction=(1, 2, 3))
    assert configurations[0].settings(base).prediction == ()
    assert configurations[1].settings(base).prediction == (1, 2, 3)
    with pytest.raises(BadUsageError, match="fixed\\+prediction"):
        drafters("fixed+prediction")


def test_the_target_alone_makes_one_token_per_pass_when_its_answer_ends_at_eos():
    # 9 tokens of text and the end-of-generation token: 10 passes, each deciding one token
    stats = GenerationStats(generated=9, target_passes=10, end_tokens=1, seconds=1.0)
    alone = bench_configs.TARGET_ALONE
    record = bench_report.RunRecord("p", "qa", alone, 0, 0, [], "", FinishReason.STOP, stats)
    assert bench_report.Aggregate.of([record]).tokens_per_pass == 1.0


def test_history_modes_parse_and_only_adaptive_modes_take_them():
    ngram = bench_configs.BenchDrafter(DrafterMode.NGRAM, prediction=True, history=True)
    assert drafters("combined+history") == [
        bench_configs.BenchDrafter(DrafterMode.COMBINED, history=True)
    ]
    assert drafters("ngram+prediction+history") == drafters("ngram+history+prediction") == [ngram]
    assert ngram.name == "ngram+prediction+history"
    configurations = bench_configs.configurations(None, drafters("ngram,ngram+history"))
    assert [c.drafter.history for c in configurations] == [False, True]
    with pytest.raises(BadUsageError, match="fixed\\+history"):
        drafters("fixed+history")


def test_the_built_in_sessions_repeat_across_requests():
    prompts = bench_prompts.load_prompts(Path("sessions"))
    sessions: dict[str, list[str]] = {}
    for prompt in prompts:
        assert prompt.session is not None
        sessions.setdefault(prompt.session, []).append(prompt.id)
    assert {s: len(ids) for s, ids in sessions.items()} == {
        "extract-invoices": 8,
        "licence-headers": 6,
        "agent-users-module": 6,
    }


def test_a_history_mode_drafts_from_the_sessions_earlier_answers(tiny_models, tmp_path):
    # Three requests of one session ask the same thing: from the second on, the earlier
    # answers are there to draft from; a request outside the session has none.
    text = "the cat sat on the mat and the dog"
    prompts = write(tmp_path, "p.yaml", "".join(
        f"- {{id: r{i}, category: qa, max_tokens: 24, text: '{text}', session: {session}}}\n"
        for i, session in ((1, "s"), (2, "s"), (3, "s"), (4, "other"))
    ))  # fmt: skip
    out = tmp_path / "b.json"
    result = runner.invoke(app(), bench_args(
        tiny_models, prompts, "--drafter", "ngram,ngram+history", "--repeats", "1",
        "--json", str(out),
    ))  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = {(r["prompt"], r["side"]): r for r in json.loads(out.read_text())["runs"]}
    history = f"ngram+history k={ADAPTIVE_DRAFT_LIMIT}"
    used = {p: runs[(p, history)]["draft_sources"].get("history", 0) for p in runs_of(runs)}
    assert used == {"r1": 0, "r2": used["r2"], "r3": used["r3"], "r4": 0}
    assert used["r2"] + used["r3"] > 0  # (how many depends on the probed costs)
    for p in runs_of(runs):
        assert runs[(p, history)]["text"] == runs[(p, bench_configs.TARGET_ALONE)]["text"]


def runs_of(runs: dict) -> list[str]:
    return sorted({prompt for prompt, _ in runs})


AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "look",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    },
}


def test_tool_turns_parse_with_their_calls_results_and_choice(tmp_path):
    turn = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": {"q": "x"}}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]  # fmt: skip
    items = [
        {"id": "call", "category": "agent", "text": "find it", "tools": [AGENT_TOOL]},
        {"id": "after", "category": "agent", "session": "s", "warm": True, "messages": turn,
         "tools": [AGENT_TOOL], "tool_choice": "none"},
    ]  # fmt: skip
    call, after = bench_prompts.load_prompts(write(tmp_path, "p.json", json.dumps(items)))
    assert call.structure() is not None and call.tool_choice == "required"
    assert after.structure() is None and after.valid("the answer") is None  # free text
    assert after.warm and after.messages[1]["tool_calls"][0]["id"] == "c1"


def test_a_warm_session_request_starts_from_what_the_previous_one_left(
    tiny_models, tmp_path, monkeypatch
):
    # Two requests of one session share a long prefix; the second is warm. Each side's timed
    # run of it follows an untimed run of the first, decodes less of its prompt than the
    # same request sent cold, and gives the same answer.
    shared = "the cat sat on the mat and the dog ran over the hill " * 4
    prompts = write(tmp_path, "p.yaml", "".join(
        f"- {{id: {name}, category: qa, max_tokens: 12, text: '{shared}{tail}', session: s"
        f"{', warm: true' if warm else ''}}}\n"
        for name, tail, warm in (("first", "and then", False), ("second", "where to", True),
                                 ("cold", "where to", False))
    ))  # fmt: skip
    decoded: dict[tuple[int, bool], list[int]] = {}
    generate = bench._generate

    def counting(pair, prompt, *args, **kwargs):
        before = pair.target.tokens_decoded
        finished = generate(pair, prompt, *args, **kwargs)
        warmed = kwargs.get("warmed", args[6] if len(args) > 6 else False)
        decoded.setdefault((len(prompt), warmed), []).append(pair.target.tokens_decoded - before)
        return finished

    monkeypatch.setattr(bench, "_generate", counting)
    out = tmp_path / "b.json"
    result = runner.invoke(app(), bench_args(
        tiny_models, prompts, "--drafter", "fixed", "--repeats", "1", "--json", str(out),
    ))  # fmt: skip
    assert result.exit_code == 0, result.output
    (second_length,) = {n for n, warmed in decoded if warmed}
    warm, cold = decoded[(second_length, True)], decoded[(second_length, False)]
    assert len(warm) == 2 and max(warm) < min(cold)  # both sides, each less than cold
    runs = {(r["prompt"], r["side"]): r["text"] for r in json.loads(out.read_text())["runs"]}
    alone = bench_configs.TARGET_ALONE
    (drafted,) = {side for _, side in runs if side != alone}
    assert runs[("second", drafted)] == runs[("second", alone)] == runs[("cold", alone)]
