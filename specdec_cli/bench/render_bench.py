"""Terminal and Markdown output for `specdec bench`: progress, tables, a bar chart."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich import box
from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from .. import render
from . import bench, bench_configs, bench_report

BAR_WIDTH = 36


def progress_display() -> RichBenchProgress | _Quiet:
    """A live progress bar on a terminal's stderr; nothing otherwise."""
    err = render.stderr_console()
    return RichBenchProgress(err) if err.is_terminal else _Quiet()


def show_report(
    report: bench_report.BenchReport, *, json_path: Path | None, markdown_path: Path | None
) -> None:
    """The report on the terminal: stdout if it is one, else stderr (stdout may be the
    JSON); for an incomplete bench, what is missing and where the partial results are."""
    err = render.stderr_console()
    if sys.stdout.isatty() and str(json_path) != "-":
        out = Console(highlight=False)
    else:
        out = err if err.is_terminal else Console(stderr=True, highlight=False, width=140)
    print_report(out, report)
    if not report.complete:
        written = [str(p) for p in (json_path, markdown_path) if p is not None and str(p) != "-"]
        where = f"; partial results in {', '.join(written)}" if written else ""
        err.print(
            f"[yellow]bench incomplete ({report.stopped_by}):[/yellow] "
            f"{report.missing_summary()}{where}",
            soft_wrap=True,
        )


class RichBenchProgress:
    """One bar over the whole run, in tokens, with the ETA; the current run as its label."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("starting", total=None)

    def __enter__(self) -> RichBenchProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def stage(self, description: str, total: int | None = None) -> None:
        if total is not None:
            self._progress.reset(self._task, total=total, description=description)
        else:
            self._progress.update(self._task, description=description)

    def advance(self, tokens: int) -> None:
        self._progress.advance(self._task, tokens)


class _Quiet(bench.NoProgress):
    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


# --- formatting helpers --------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _speedup(row: bench_report.Row) -> str:
    return "–" if row.speedup is None else f"{row.speedup.value:.2f}×"


def _interval(row: bench_report.Row) -> str:
    s = row.speedup
    return "–" if s is None else f"{s.low:.2f}–{s.high:.2f}"


def _output(row: bench_report.Row) -> str:
    check = row.check
    if check is None:
        return "–"
    c = check.comparison
    if c.identical:
        mark = "identical"
    else:
        mark = f"differs at token {c.first_difference} (top-2 margin {c.top2_margin:.2f})"
    if check.repeats > 1 and check.identical_repeats not in (0, check.repeats):
        mark += f", {check.identical_repeats}/{check.repeats} repeats"
    return mark


def _identical(row: bench_report.Row) -> str:
    if not row.compared_prompts:
        return "–"
    return f"{row.identical_prompts}/{row.compared_prompts}"


def _split(agg: bench_report.Aggregate) -> str:
    split = agg.time_split()
    if split is None:
        return "–"
    return f"{_pct(split['draft'])}/{_pct(split['verify'])}/{_pct(split['other'])}"


def _styled_speedup(row: bench_report.Row) -> Text:
    if row.speedup is None:
        return Text("–")
    colour = "green" if row.speedup.low > 1 else "red" if row.speedup.high < 1 else "yellow"
    return Text(_speedup(row), style=f"bold {colour}")


def _tps(row: bench_report.Row) -> str:
    return f"{_num(row.alone.tokens_per_second)} → {_num(row.speculative.tokens_per_second)}"


def _ttft(row: bench_report.Row) -> str:
    alone, spec = row.alone.first_token_seconds, row.speculative.first_token_seconds
    return f"{_num(alone, '.2f')}/{_num(spec, '.2f')} s"


def _drafted(row: bench_report.Row) -> str:
    return f"{row.speculative.drafted}/{row.speculative.accepted}"


def _speedup_cell(row: bench_report.Row) -> Text:
    if row.speedup is None:
        return Text("–")
    return Text.assemble(_styled_speedup(row), (f" ({_interval(row)})", "dim"))


# --- the results tables, each described once ----------------------------------------------
#
# A table is its rows and its columns; both outputs are made from that one description. The
# terminal fits a screen: one cell per column, two values packed into one ("18.6 → 31.9"),
# colour, short headers, the config and oracle columns only when they say something. The
# Markdown report is a file to keep and compare: every column always, a packed cell as its
# separate values, plain text, no alignment row (as it always was).

Cell = Callable[[bench_report.Row], str]


@dataclass(frozen=True)
class View:
    """What the terminal shows of a report (the Markdown shows everything)."""

    sweep: bool  # several configurations: the config column, and a ★ on each scope's best
    oracle: bool  # the oracle ran: the "of oracle" column
    best: Mapping[str, str]  # per category (and "suite"), the best configuration

    @classmethod
    def of(cls, report: bench_report.BenchReport) -> View:
        sweep = len(report.configurations) > 1
        oracle = any(c.label == bench_configs.ORACLE for c in report.configurations)
        best = bench_report.BenchReport.best(report.category_rows()) if sweep else {}
        return cls(sweep, oracle, best)


def _always(view: View) -> bool:
    return True


def _markdown_only(view: View) -> bool:
    return False


@dataclass(frozen=True)
class Column:
    """One column: its header and cell on the terminal, its column(s) in Markdown.

    The terminal's cell is `styled`, else `text` (a str, as Rich reads markup in it); the
    Markdown's columns are `markdown`, else one column of `text` under `header`."""

    header: str
    text: Cell | None = None
    styled: Callable[[bench_report.Row, View], RenderableType] | None = None
    markdown: tuple[tuple[str, Cell], ...] | None = None
    justify: Literal["left", "right"] = "right"
    no_wrap: bool = False
    on_terminal: Callable[[View], bool] = _always

    def terminal_cell(self, row: bench_report.Row, view: View) -> RenderableType:
        if self.styled is not None:
            return self.styled(row, view)
        assert self.text is not None, f"column {self.header!r} has no cell"
        return self.text(row)

    def markdown_columns(self) -> tuple[tuple[str, Cell], ...]:
        if self.markdown is not None:
            return self.markdown
        assert self.text is not None, f"column {self.header!r} has no cell"
        return ((self.header, self.text),)


@dataclass(frozen=True)
class ResultsTable:
    """One results table: its rows and its columns, for both outputs."""

    title: str  # the Markdown's heading; the terminal's title with `note`
    note: str
    rows: Callable[[bench_report.BenchReport], list[bench_report.Row]]
    group: Callable[[bench_report.Row], object]  # the terminal draws a rule where it changes
    columns: tuple[Column, ...]


def _starred(row: bench_report.Row, view: View) -> str:
    return row.configuration + (" ★" if view.best.get(row.name) == row.configuration else "")


_CONFIG = Column(
    "config",
    lambda r: r.configuration,
    justify="left",
    no_wrap=True,
    on_terminal=lambda view: view.sweep,
)
_TOKENS_PER_SECOND = Column(
    "tok/s alone→spec",
    _tps,
    markdown=(
        ("alone tok/s", lambda r: _num(r.alone.tokens_per_second)),
        ("spec tok/s", lambda r: _num(r.speculative.tokens_per_second)),
    ),
)
_SPEEDUP = Column(
    "speedup (95% CI)",
    styled=lambda r, view: _speedup_cell(r),
    markdown=(("speedup", _speedup), ("95% CI", _interval)),
)
_ACCEPT = Column("accept", lambda r: _pct(r.speculative.acceptance))
_TOKENS_PER_PASS = Column("tok/pass", lambda r: _num(r.speculative.tokens_per_pass, ".2f"))
_DRAFTED = Column("drafted/acc", _drafted, markdown=(("drafted/accepted", _drafted),))

PROMPTS = ResultsTable(
    title="Per prompt",
    note="tok/s and time to first token: medians over repeats",
    rows=lambda report: report.prompt_rows(),
    group=lambda row: row.category,
    columns=(
        Column(
            "prompt",
            styled=lambda r, view: Text.assemble(r.name, (f" {r.category}", "dim")),
            markdown=(("prompt", lambda r: r.name), ("category", lambda r: r.category or "")),
            justify="left",
        ),
        _CONFIG,
        Column("prompt tokens", lambda r: _num(r.prompt_tokens, "d"), on_terminal=_markdown_only),
        _TOKENS_PER_SECOND,
        _SPEEDUP,
        _ACCEPT,
        _TOKENS_PER_PASS,
        _DRAFTED,
        Column(
            "TTFT alone/spec",
            _ttft,
            markdown=(
                ("TTFT alone", lambda r: _num(r.alone.first_token_seconds, ".3f", " s")),
                ("TTFT spec", lambda r: _num(r.speculative.first_token_seconds, ".3f", " s")),
            ),
        ),
        Column(
            "draft lengths",
            lambda r: " ".join(f"{k}:{v}" for k, v in r.speculative.draft_lengths.items()),
            on_terminal=_markdown_only,
        ),
        Column("output", _output, justify="left"),
    ),
)

CATEGORIES = ResultsTable(
    title="Per category",
    note="speedup: geometric mean of the per-prompt medians",
    rows=lambda report: report.category_rows() + report.suite_rows(),
    group=lambda row: row.scope,  # the suite's rows below the categories'
    columns=(
        Column(
            "category",
            lambda r: r.name,
            styled=lambda r, view: Text(r.name, style="bold" if r.scope == "suite" else ""),
            justify="left",
        ),
        replace(_CONFIG, styled=_starred),
        _TOKENS_PER_SECOND,
        _SPEEDUP,
        _ACCEPT,
        _TOKENS_PER_PASS,
        replace(_DRAFTED, on_terminal=_markdown_only),
        Column("time draft/verify/other", lambda r: _split(r.speculative)),
        Column("identical", _identical),
        Column("of oracle", lambda r: _pct(r.efficiency), on_terminal=lambda view: view.oracle),
    ),
)


# --- terminal ------------------------------------------------------------------------------


def print_report(console: Console, report: bench_report.BenchReport) -> None:
    if report.runs:
        view = View.of(report)
        console.print(terminal_table(PROMPTS, report, view))
        console.print(terminal_table(CATEGORIES, report, view))
        console.print(bar_chart(report))
    for line in summary_lines(report):
        console.print(line, soft_wrap=True)


def terminal_table(spec: ResultsTable, report: bench_report.BenchReport, view: View) -> Table:
    table = Table(
        title=f"{spec.title} ({spec.note})",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    columns = [c for c in spec.columns if c.on_terminal(view)]
    for column in columns:
        table.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap)
    previous = None
    for row in spec.rows(report):
        if previous is not None and spec.group(row) != spec.group(previous):
            table.add_section()
        previous = row
        table.add_row(*(column.terminal_cell(row, view) for column in columns))
    return table


def bar_chart(report: bench_report.BenchReport) -> Text:
    """Speedup per category (and configuration) as bars; the │ marks 1.0×."""
    rows = report.category_rows() + report.suite_rows()
    measured = [(r, r.speedup.value) for r in rows if r.speedup is not None]
    text = Text()
    text.append("Speedup over the target alone (│ = 1.0×)\n", style="bold")
    if not measured:
        return text
    scale = BAR_WIDTH / max(max(speedup for _, speedup in measured), 1.0)
    one = max(1, round(scale))
    sweep = len(report.configurations) > 1
    width = max(len(_bar_label(r, sweep)) for r, _ in measured)
    for row, speedup in measured:
        cells = round(speedup * scale)
        bar = "".join(
            "│" if i == one - 1 and i >= cells else "█" if i < cells else " "
            for i in range(max(cells, one))
        )
        colour = "green" if speedup >= 1 else "red"
        text.append(f"{_bar_label(row, sweep):<{width}} ")
        text.append(bar, style=colour)
        text.append(f" {speedup:.2f}×\n")
    return text


def _bar_label(row: bench_report.Row, sweep: bool) -> str:
    return f"{row.name} · {row.configuration}" if sweep else row.name


def summary_lines(report: bench_report.BenchReport) -> list[str]:
    lines = []
    suite = report.suite_rows()
    for row in suite:
        if row.speedup is None:
            continue
        same = (
            f"; output identical to the target alone on {row.identical_prompts}/"
            f"{row.compared_prompts} prompts"
            if row.compared_prompts
            else ""
        )
        lines.append(
            f"[bold]{row.configuration}[/bold]: geometric-mean speedup over {row.prompts} "
            f"prompts {row.speedup.value:.2f}× (95% CI {row.speedup.low:.2f}–"
            f"{row.speedup.high:.2f}), {_num(row.alone.tokens_per_second)} → "
            f"{_num(row.speculative.tokens_per_second)} tok/s{same}"
        )
    validity = report.validity()
    if validity is not None:
        lines.append(
            f"structured answers: {validity['valid']} of {validity['answers']} parsed and "
            "matched their schema or tool"
        )
    if report.costs is not None:  # the table the planners started from, and the runs' own
        lines.append(render.costs_summary(report.costs))
    if report.costs_fast is not None:  # exact mode: the same probe with llama.cpp's kernels
        lines.append("llama.cpp's kernels: " + render.costs_summary(report.costs_fast))
    if len(suite) > 1:
        best_all = bench_report.BenchReport.best(suite).get("suite")
        per_category = bench_report.BenchReport.best(report.category_rows())
        lines.append(
            f"best overall: {best_all}; per category: "
            + ", ".join(f"{cat} {label}" for cat, label in per_category.items())
        )
    return lines


# --- Markdown ------------------------------------------------------------------------------


def markdown(report: bench_report.BenchReport) -> str:
    """The whole report as Markdown: settings, machine, models, tables, what is missing."""
    settings, machine = report.settings, report.machine
    lines = ["# specdec bench", ""]
    if not report.complete:
        lines += [f"**Incomplete** ({report.stopped_by}): {report.missing_summary()}", ""]
    lines += [strip_markup(line) for line in summary_lines(report)]
    for spec in (CATEGORIES, PROMPTS):
        lines += ["", f"## {spec.title}", ""]
        lines += markdown_table(spec, report)
    lines += ["", "## Settings", ""]
    lines += _md_table(
        ["setting", "value"],
        [[key, f"`{value}`"] for key, value in settings.items() if key != "prompt_ids"],
    )
    lines += ["", "## Machine", ""]
    lines += _md_table(["", ""], [[key, f"`{value}`"] for key, value in machine.items()])
    lines += ["", "## Models", ""]
    lines += _md_table(
        ["role", "file", "description", "parameters", "bytes", "SHA-256"],
        [
            [
                role,
                m.get("file", ""),
                str(m.get("description", "")),
                str(m.get("parameters", "")),
                str(m.get("size_bytes", "")),
                f"`{m.get('sha256', '')}`",
            ]
            for role, m in report.models.items()
        ],
    )
    lines += ["", "## Method", ""]
    lines += [f"- **{key}**: {value}" for key, value in bench_report.METHOD.items()]
    lines += ["", f"Started {report.started_at}, finished {report.finished_at}.", ""]
    return "\n".join(lines)


def markdown_table(spec: ResultsTable, report: bench_report.BenchReport) -> list[str]:
    columns = [column for c in spec.columns for column in c.markdown_columns()]
    return _md_table(
        [header for header, _ in columns],
        [[cell(row) for _, cell in columns] for row in spec.rows(report)],
    )


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def strip_markup(text: str) -> str:
    return Text.from_markup(text).plain
