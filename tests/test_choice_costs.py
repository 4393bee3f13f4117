"""scripts/choice_costs.py on this CPU with a tiny model: greedy choices timed on the host and
on the device (here the CPU's backend runs llama.cpp's sampler), and the device's choices
compared with the host's as the GPU run reads them; choices that differ fail the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from project_scripts import load_script

from specdec_cli.llama.device_choices import DeviceChoices, DeviceSampler


@pytest.fixture(scope="module")
def choice_costs():
    return load_script("choice_costs")


def run(choice_costs, monkeypatch, capsys, model: Path) -> tuple[int, dict, str]:
    for name, value in (("BLOCKS", 1), ("REPEATS", 2), ("WARMUP", 1)):
        monkeypatch.setattr(choice_costs, name, value)
    monkeypatch.setattr(sys, "argv", ["choice_costs.py", "0", str(model)])
    code = choice_costs.main()
    out = capsys.readouterr().out
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return code, found[-1], out


def test_both_sides_are_timed_and_choose_alike(choice_costs, tiny_models, monkeypatch, capsys):
    model = tiny_models.kquant_target
    code, found, out = run(choice_costs, monkeypatch, capsys, model)
    assert code == 0, out
    result = found[f"{model.name}:choices"]
    for side in ("host_ms", "device_ms"):
        assert set(result[side]) == {"1", "8", "step"}
        assert all(ms > 0 for ms in result[side].values())
    assert result["same_choices"] is True
    assert f"{model.name}: greedy choices: 1 row" in out


def test_choices_other_than_the_hosts_fail_the_run(choice_costs, tiny_models, monkeypatch, capsys):
    choices = DeviceSampler.choices

    def shifted(self, first: int, n: int) -> DeviceChoices:
        chosen = choices(self, first, n)
        return DeviceChoices([token + 1 for token in chosen.tokens], chosen.confidences)

    monkeypatch.setattr(DeviceSampler, "choices", shifted)
    code, found, out = run(choice_costs, monkeypatch, capsys, tiny_models.kquant_target)
    assert code == 1
    assert found[f"{tiny_models.kquant_target.name}:choices"]["same_choices"] is False
    assert out.strip().splitlines()[-1] == "greedy choices on the device pay: no"


def test_a_drafters_probabilities_other_than_the_hosts_fail_the_run(
    choice_costs, tiny_models, monkeypatch, capsys
):
    probability = DeviceSampler._probability
    monkeypatch.setattr(
        DeviceSampler, "_probability", lambda self, row: probability(self, row) * (1 + 1e-3)
    )
    code, found, out = run(choice_costs, monkeypatch, capsys, tiny_models.kquant_target)
    assert code == 1


def measured(host: dict, device: dict, same: bool = True) -> dict:
    return {"host_ms": host, "device_ms": device, "same_choices": same}


def test_choices_pay_only_where_every_decode_costs_no_more_and_chooses_alike(choice_costs):
    host = {"1": 4.0, "8": 9.0, "step": 1.4}
    cheaper = {"1": 3.9, "8": 8.6, "step": 1.3}
    assert choice_costs.pays({"7b": measured(host, cheaper), "0.5b": measured(host, host)})
    dearer_step = cheaper | {"step": 1.5}
    assert not choice_costs.pays(
        {"7b": measured(host, cheaper), "0.5b": measured(host, dearer_step)}
    )
    assert not choice_costs.pays({"7b": measured(host, cheaper, same=False)})
