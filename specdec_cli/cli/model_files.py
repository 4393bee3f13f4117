"""`specdec pull`, `models` and `history`: the files specdec keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import render
from ..errors import BadUsageError
from ..request import HardwareOptions
from .app import app, user_errors
from .options import ModelsFileOpt, ThreadsOpt
from .shared import DEFAULT_TARGET


@app.command()
def pull(
    names: Annotated[
        list[str] | None, typer.Argument(help="Names or aliases (default: the default pair).")
    ] = None,
    models: ModelsFileOpt = None,
    optimize_drafter: Annotated[
        bool,
        typer.Option(
            "--optimize-drafter",
            help="Also build a Q4_0 copy of each drafter pulled (faster on CPUs), measure its "
            "speed and acceptance against the original, and record it in your models.yaml.",
        ),
    ] = False,
    threads: ThreadsOpt = None,
) -> None:
    """Download and verify models; prints NAME<TAB>PATH per model."""
    from .. import render_fetch
    from ..models.resolve import pull as pull_models

    with user_errors():
        progress = render_fetch.RichFetchProgress()
        pulled = pull_models(names or [], models_file=models, progress=progress)
        render_fetch.print_pulled(pulled)
        if optimize_drafter:
            optimise_pulled_drafters(pulled, models, progress, HardwareOptions(threads=threads))


def optimise_pulled_drafters(pulled, models: Path | None, progress, hardware) -> None:
    from .. import render_fetch
    from ..commands.tune import optimise_drafter
    from ..models.resolve import resolve_model

    drafters = [m for m in pulled if m.entry is not None and m.entry.role == "drafter"]
    if not drafters:
        raise BadUsageError(
            "--optimize-drafter found no drafter among the models pulled.",
            "Name one, e.g. `specdec pull small --optimize-drafter`.",
        )
    target = resolve_model(DEFAULT_TARGET, models_file=models, progress=progress)
    console = render.stderr_console()
    for drafter in drafters:
        with console.status(f"requantising and measuring {drafter.name}…"):
            result = optimise_drafter(drafter, target, hardware, models)
        render.print_optimisation(console, result, target.name)
        render_fetch.print_pulled([resolve_model(result.name, models_file=models)])


@app.command(name="models")
def list_models(
    models: ModelsFileOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    paths: Annotated[bool, typer.Option("--paths", help="Show where each file is.")] = False,
) -> None:
    """List the registry: what is downloaded where, and which drafter fits which target."""
    from .. import render_fetch
    from ..models.model_status import model_statuses
    from ..models.registry import load_registry

    with user_errors():
        statuses = model_statuses(load_registry(models))
        if json_output:
            render_fetch.print_models_json(statuses)
        else:
            render_fetch.print_models_table(statuses, paths=paths)


@app.command(name="history")
def show_history(
    folder: Annotated[
        Path | None,
        typer.Argument(
            envvar="SPECDEC_HISTORY",
            file_okay=False,
            help="The --history folder (default: $SPECDEC_HISTORY).",
            show_default=False,
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Delete the stored prompts and answers.")
    ] = False,
) -> None:
    """Show what a --history folder holds (or clear it)."""
    from ..services import history_file as history

    with user_errors():
        if folder is None:
            raise BadUsageError(
                "no history folder given.", "Name one (specdec history DIR) or set SPECDEC_HISTORY."
            )
        if clear:
            cleared = history.clear(folder)
            render.stderr_console().print(f"cleared {cleared} history file(s) in {folder}")
        else:
            render.print_history(render.stdout_console(), folder, history.summarize(folder))
