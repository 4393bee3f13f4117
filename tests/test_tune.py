"""`specdec pull --optimize-drafter` on tiny models: requantise, measure, record."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.models.registry import load_registry
from specdec_cli.models.resolve import resolve_model


@pytest.mark.slow  # requantises and measures a drafter (make test-fast: a third of make test)
def test_optimize_drafter_builds_measures_and_records(tiny_models, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    registry = tmp_path / "models.yaml"
    registry.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "models": {
                    "tiny-target": {
                        "family": "tiny",
                        "role": "target",
                        "params": "1M",
                        "sources": [{"path": str(tiny_models.target)}],
                    },
                    "tiny-drafter": {
                        "family": "tiny",
                        "role": "drafter",
                        "params": "0.5M",
                        "sources": [{"path": str(tiny_models.close_drafter)}],
                    },
                },
                "aliases": {"large": "tiny-target", "small": "tiny-drafter"},
            }
        )
    )
    result = CliRunner().invoke(
        app, ["pull", "small", "--optimize-drafter", "--models", str(registry)]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["tiny-drafter", "tiny-drafter-q4_0"]
    built = tmp_path / "home" / "models" / "tiny-drafter-q4_0.gguf"
    assert built.read_bytes()[:4] == b"GGUF"
    assert built.stat().st_size < tiny_models.close_drafter.stat().st_size / 3
    assert "acceptance" in result.stderr and "requantised" in result.stderr
    recorded = load_registry(registry).lookup("small-q4_0")
    assert recorded.name == "tiny-drafter-q4_0" and recorded.quant == "Q4_0"
    assert resolve_model("small-q4_0", models_file=registry).path == built


def test_optimize_drafter_needs_a_drafter(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    registry = tmp_path / "models.yaml"
    registry.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "models": {
                    "tiny-target": {
                        "family": "tiny",
                        "role": "target",
                        "sources": [{"path": str(tiny_models.target)}],
                    }
                },
            }
        )
    )
    result = CliRunner().invoke(
        app, ["pull", "tiny-target", "--optimize-drafter", "--models", str(registry)]
    )
    assert result.exit_code == 2
    assert "no drafter" in result.stderr
