"""`make run`, the README's first command, with a stand-in virtualenv: which command it runs
with which prompt, and that it installs first what is missing (nothing is built here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def fake_venv(directory: Path, *, installed: bool) -> Path:
    """A virtualenv whose `specdec` prints its arguments, one per line."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    specdec = bin_dir / "specdec"
    specdec.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    specdec.chmod(0o755)
    if installed:
        (directory / ".specdec-installed").touch()  # newer than everything install needs
    return directory


def make(*args: str, prompt: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PROMPT", "MAKEFLAGS")}
    if prompt is not None:
        env["PROMPT"] = prompt
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def test_make_run_answers_the_default_prompt_with_the_default_pair(tmp_path):
    venv = fake_venv(tmp_path / "venv", installed=True)
    printed = make("run", f"VENV={venv}").stdout.splitlines()
    assert printed == [
        "run",
        "--draft",
        "tiny",
        "--target",
        "large",
        "--",
        "Write a Python function that reverses a linked list.",
    ]


def test_prompt_changes_it_quotes_and_dashes_included(tmp_path):
    venv = fake_venv(tmp_path / "venv", installed=True)
    tricky = """Say "hi" -n 3, it's `ls` and $HOME"""
    assert make("run", f"VENV={venv}", prompt=tricky).stdout.splitlines()[-1] == tricky
    on_the_line = make("run", f"VENV={venv}", "PROMPT=Name a sorting algorithm.")
    assert on_the_line.stdout.splitlines()[-1] == "Name a sorting algorithm."


def test_make_run_installs_first_what_is_missing(tmp_path):
    venv = tmp_path / "no-venv-yet"
    planned = make("-n", "run", f"VENV={venv}").stdout
    build = planned.index("scripts/build-llama-cpp-python.sh")
    assert planned.index(f"{venv}/bin/specdec run") > build
