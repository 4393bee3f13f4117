"""`specdec bench` loads its pair through the commands' one lifecycle (services/lifecycle.py)
and names what it compares with typed modes, not strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_requests import bench_request

from specdec_cli.bench import bench, bench_configs, bench_prompts
from specdec_cli.bench.bench_configs import BenchDrafter, BenchOnly
from specdec_cli.decoding.modes import DrafterMode
from specdec_cli.models.loading import load_pair, load_with_llama_cpp
from specdec_cli.request import HardwareOptions
from specdec_cli.services import cost_cache

PROMPTS_YAML = """\
- {id: greet, category: prose, text: hello world the code, max_tokens: 12}
- {id: short, category: code, text: the cat sat on the mat, max_tokens: 12}
"""


def prompts(tmp_path: Path) -> list[bench_prompts.BenchPrompt]:
    path = tmp_path / "p.yaml"
    path.write_text(PROMPTS_YAML, encoding="utf-8")
    return bench_prompts.load_prompts(path)


def test_every_model_of_a_bench_is_loaded_by_the_lifecycles_loader(tiny_models, tmp_path):
    loaded: list[tuple[str, bool]] = []

    def counting_loader(path, *, drafter, n_ctx, hardware):
        loaded.append((Path(path).name, drafter))
        return load_with_llama_cpp(path, drafter=drafter, n_ctx=n_ctx, hardware=hardware)

    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts(tmp_path)[:1],
        bench_configs.configurations([3], extra_drafts=["other"]),
        hardware=HardwareOptions(ctx_size=512),
        extra_drafts={"other": Path(tiny_models.unrelated_drafter)},
        repeats=1,
        warmup_tokens=0,
    )
    report = bench.run_bench(request, loader=counting_loader)
    assert report.complete
    assert loaded == [
        (Path(tiny_models.target).name, False),
        (Path(tiny_models.close_drafter).name, True),
        (Path(tiny_models.unrelated_drafter).name, True),
    ]


def test_the_next_command_starts_from_the_costs_a_bench_measured(
    tiny_models, tmp_path, monkeypatch
):
    hardware = HardwareOptions(ctx_size=512)
    request = bench_request(
        tiny_models.target,
        tiny_models.close_drafter,
        prompts(tmp_path),
        bench_configs.configurations([3], bench_configs.parse_drafters("combined")),
        hardware=hardware,
        repeats=2,
        warmup_tokens=0,
    )
    report = bench.run_bench(request)
    assert report.complete and report.costs is not None
    written = json.loads(cost_cache.costs_cache().read_text(encoding="utf-8"))
    assert len(written) == 1

    def no_probe(*args, **kwargs):
        raise AssertionError("the costs were probed again instead of read back")

    monkeypatch.setattr(cost_cache, "measure_pair_costs", no_probe)
    pair = load_pair(Path(tiny_models.target), Path(tiny_models.close_drafter), hardware)
    costs = cost_cache.pair_costs(pair, hardware)
    (entry,) = written.values()
    assert costs.draft_step == pytest.approx(entry["draft_step"])


def test_a_drafter_given_twice_is_compared_once():
    drafters = bench_configs.parse_drafters("combined, ngram+history,combined,ngram+history")
    assert drafters == [
        BenchDrafter(DrafterMode.COMBINED),
        BenchDrafter(DrafterMode.NGRAM, history=True),
    ]
    labels = [c.label for c in bench_configs.configurations([4], drafters)]
    assert labels == ["combined k=4", "ngram+history k=4"]


def test_modes_are_typed_and_reports_keep_their_names():
    for text, mode in (("oracle", BenchOnly.ORACLE), ("fixed", DrafterMode.FIXED)):
        (drafter,) = bench_configs.parse_drafters(text)
        assert drafter.mode is mode and drafter.name == text
    oracle, combined = bench_configs.configurations(
        None, bench_configs.parse_drafters("oracle,combined+prediction")
    )
    record = json.loads(json.dumps([oracle.as_dict(), combined.as_dict()]))
    assert [r["drafter"] for r in record] == ["oracle", "combined"]
    assert combined.label.startswith("combined+prediction k=")
    assert oracle.label == bench_configs.ORACLE
