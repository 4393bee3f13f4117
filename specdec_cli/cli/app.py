"""The Typer app every command registers on, and how known problems reach the user."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import typer

from .. import render
from ..errors import EXIT_INTERRUPTED, SpecdecError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Exact speculative decoding for local GGUF models on llama.cpp.",
    # Click's plain help: name and description, the text wrapped in what is left of the
    # terminal. Rich's panels add a type column and left serve's help a 20-column text at 80.
    rich_markup_mode=None,
)

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader left


@contextmanager
def user_errors():
    """Known problems become one line on stderr and a meaningful exit code."""
    try:
        yield
    except SpecdecError as error:
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        render.stderr_console().print(f"[bold red]error:[/bold red] {error}", soft_wrap=True)
        raise typer.Exit(error.exit_code) from None
    except KeyboardInterrupt:
        render.stderr_console().print("[yellow]interrupted[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # stdout's reader went away (`| head`): stop quietly, as Unix tools do
        _discard_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a file descriptor (tests capture stdout)
        pass
