"""The Typer app: parse options, build objects, call the engine and the renderer. Wiring only."""

from __future__ import annotations

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Exact speculative decoding for local GGUF models on llama.cpp.",
)


def main() -> None:
    app()
