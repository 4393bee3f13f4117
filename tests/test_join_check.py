"""scripts/join_check.py: the JSON lines a measuring script printed join the GPU run's
check.json, so that a run cut short by its timeout keeps the models it finished."""

from __future__ import annotations

import json
import sys

import pytest
from project_scripts import load_script


@pytest.fixture(scope="module")
def join_check():
    return load_script("join_check")


def test_every_models_line_joins_and_a_line_cut_short_is_left_out(
    join_check, tmp_path, monkeypatch
):
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"7b:choices": {"same_choices": True}}))
    output = tmp_path / "check.txt"
    lines = [
        "qwen2.5-7b.gguf:exact",
        json.dumps({"7b:exact": {"steady_ms": 1}, "7b:fast": {"steady_ms": 2}}),
        "  n= 2 identical rows 2/2",
        json.dumps({"1.5b:exact": {"steady_ms": 3}}),
        '{"0.5b:exact": {"steady',  # the timeout struck while it was printed
    ]
    output.write_text("\n".join(lines) + "\n")
    joined(join_check, monkeypatch, check, output)
    assert json.loads(check.read_text()) == {
        "7b:choices": {"same_choices": True},
        "7b:exact": {"steady_ms": 1},
        "7b:fast": {"steady_ms": 2},
        "1.5b:exact": {"steady_ms": 3},
    }


def test_exact_keys_are_read_under_another_name(join_check, tmp_path, monkeypatch):
    check, output = tmp_path / "check.json", tmp_path / "fattn.txt"
    output.write_text(json.dumps({"7b:exact": {"steady_ms": 1}}) + "\n")
    joined(join_check, monkeypatch, check, output, ":exact+fattn_rows")
    assert json.loads(check.read_text()) == {"7b:exact+fattn_rows": {"steady_ms": 1}}


def test_an_output_without_measurements_leaves_an_empty_check(join_check, tmp_path, monkeypatch):
    check = tmp_path / "check.json"
    joined(join_check, monkeypatch, check, tmp_path / "never-written.txt")
    assert json.loads(check.read_text()) == {}


def joined(join_check, monkeypatch, *args) -> None:
    monkeypatch.setattr(sys, "argv", ["join_check.py", *map(str, args)])
    assert join_check.main() == 0
