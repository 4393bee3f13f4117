"""Rich output for model downloads and the `specdec models` table (stderr / stdout)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from .models.model_status import ModelStatus
from .models.resolve import ResolvedModel


class RichFetchProgress:
    """A FetchProgress drawing one bar per file (bytes, speed, ETA) on stderr.

    When stderr is not a terminal it prints one line per finished file instead of a bar.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._done = 0

    def start(self, label: str, total: int | None) -> None:
        self._label, self._done = label, 0
        if not self.console.is_terminal:
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = self._task = None
        elif self._label:
            self.console.print(f"fetched {self._label}: {_human_bytes(self._done)}")
        self._label = ""

    def note(self, message: str) -> None:
        self.console.print(f"[yellow]{message}[/yellow]", soft_wrap=True)


def print_pulled(models: Sequence[ResolvedModel]) -> None:
    """One line per model on stdout, NAME<TAB>PATH, plain text for scripts (no Rich markup)."""
    for model in models:
        print(f"{model.name}\t{model.path}")


def print_models_json(statuses: Sequence[ModelStatus], console: Console | None = None) -> None:
    (console or Console()).print_json(json.dumps([s.to_json() for s in statuses]))


def print_models_table(
    statuses: Sequence[ModelStatus], console: Console | None = None, *, paths: bool = False
) -> None:
    """One row per model, readable at 80 columns: names whole, the details under them, local
    files as a mark (`paths`: their full paths too), targets by their shortest name."""
    console = console or Console()
    table = Table(
        title="Models (specdec pull NAME to download)", title_justify="left", box=box.SIMPLE_HEAD
    )
    longest = max((len(s.name) for s in statuses), default=4)
    table.add_column("name", min_width=longest, overflow="fold")
    for column in ("role", "size", "local"):
        table.add_column(column, justify="right" if column == "size" else "left", no_wrap=True)
    table.add_column("drafter for")
    short_names = {s.name: min((s.name, *s.aliases), key=len) for s in statuses}
    for s in statuses:
        table.add_row(
            _name_cell(s, paths),
            s.role or "",
            _human_bytes(s.size) if s.size else "?",
            "[green]yes[/green]" if s.path else "[dim]no[/dim]",
            _drafter_for(s, short_names),
        )
    console.print(table)


def _drafter_for(status: ModelStatus, short_names: dict[str, str]) -> str:
    """The targets it drafts for, a line each: by token ids, then by text."""
    if not status.vocab:
        return "[dim]unknown vocab[/dim]"
    lines = [short_names.get(t, t) for t in status.drafter_for]
    if status.text_drafter_for:
        lines.append("[dim]by text:[/dim]")
        lines += [short_names.get(t, t) for t in status.text_drafter_for]
    return "\n".join(lines)


def _name_cell(status: ModelStatus, paths: bool) -> Text:
    kind = " ".join(part for part in (status.family, status.params, status.quant) if part)
    aliases = f" · also {', '.join(status.aliases)}" if status.aliases else ""
    cell = Text(status.name)
    cell.append(f"\n{kind}{aliases}", style="dim")
    if paths and status.path:
        # Folded, not cut: a path is copied whole or not at all.
        cell.append(f"\n{status.path}", style="green")
    return cell


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
