"""Every command's --help, against the texts kept in tests/help/ (recorded before cli.py
became the cli/ package; a deliberate change of an option updates its file). Options are
declared once (cli/options.py) and each command module registers itself: this shows that
none was lost, renamed or given another default on the way."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app

KEPT = Path(__file__).parent / "help"
COMMANDS = ["main", "run", "pull", "models", "history", "chat", "serve", "bench", "worker"]


def help_text(command: str) -> str:
    args = [] if command == "main" else [command]
    result = CliRunner().invoke(
        app, [*args, "--help"], env={"COLUMNS": "100", "TERM": "dumb"}, terminal_width=100
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_what_it_was(command):
    assert help_text(command) == (KEPT / f"{command}.txt").read_text()


def test_every_command_has_its_help_kept():
    listed = help_text("main").split("Commands:", 1)[1].split()
    assert {word for word in listed if word in COMMANDS} == set(COMMANDS) - {"main"}
