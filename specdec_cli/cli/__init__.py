"""The command line: parse options, build requests, call the commands. Wiring only.

app.py the Typer app and errors; options.py the shared options, declared once; shared.py
what commands do with them before loading models; one module per command group."""

# Importing a command's module registers it; `specdec --help` lists them in this order.
from . import run, model_files, chat, serve, bench, worker  # noqa: F401, I001
from .app import app


def main() -> None:
    app()
