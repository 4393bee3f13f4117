"""scripts/choice_costs.py on this CPU with a tiny model: greedy choices timed on the host and
on the device (here the CPU's backend runs llama.cpp's sampler), and the device's choices
compared with the host's as the GPU run reads them; choices that differ fail the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from project_scripts import load_script

from specdec_cli.llama.device_choices import DeviceArgmax


@pytest.fixture(scope="module")
def choice_costs():
    return load_script("choice_costs")


def run(choice_costs, monkeypatch, capsys, model: Path) -> tuple[int, dict, str]:
    for name, value in (("BLOCKS", 1), ("REPEATS", 2), ("WARMUP", 1)):
        monkeypatch.setattr(choice_costs, name, value)
    monkeypatch.setattr(sys, "argv", ["choice_costs.py", "0", str(model)])
    code = choice_costs.main()
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1]), out


def test_both_sides_are_timed_and_choose_alike(choice_costs, tiny_models, monkeypatch, capsys):
    model = tiny_models.kquant_target
    code, found, out = run(choice_costs, monkeypatch, capsys, model)
    assert code == 0, out
    result = found[f"{model.name}:choices"]
    for side in ("host_ms", "device_ms"):
        assert set(result[side]) == {"1", "8"} and all(ms > 0 for ms in result[side].values())
    assert result["same_choices"] is True
    assert f"{model.name}: greedy choices: 1 rows" in out


def test_choices_other_than_the_hosts_fail_the_run(choice_costs, tiny_models, monkeypatch, capsys):
    tokens = DeviceArgmax.tokens
    monkeypatch.setattr(
        DeviceArgmax, "tokens", lambda self, first, n: [t + 1 for t in tokens(self, first, n)]
    )
    code, found, out = run(choice_costs, monkeypatch, capsys, tiny_models.kquant_target)
    assert code == 1
    assert found[f"{tiny_models.kquant_target.name}:choices"]["same_choices"] is False
