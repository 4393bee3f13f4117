"""Terminal and Markdown output for `specdec bench`: progress, tables, a bar chart."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

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


# --- terminal ------------------------------------------------------------------------------


def print_report(console: Console, report: bench_report.BenchReport) -> None:
    sweep = len(report.configurations) > 1
    if report.runs:
        console.print(prompt_table(report, sweep))
        console.print(category_table(report, sweep))
        console.print(bar_chart(report))
    for line in summary_lines(report):
        console.print(line, soft_wrap=True)


def prompt_table(report: bench_report.BenchReport, sweep: bool) -> Table:
    table = _table("Per prompt (tok/s and time to first token: medians over repeats)")
    _add_columns(
        table,
        [
            "prompt",
            "config",
            "tok/s alone→spec",
            "speedup (95% CI)",
            "accept",
            "drafted/acc",
            "tok/pass",
            "TTFT alone/spec",
            "output",
        ],
        sweep,
    )
    category = None
    for row in report.prompt_rows():
        if row.category != category and category is not None:
            table.add_section()
        category = row.category
        cells: list[RenderableType] = [
            Text.assemble(row.name, (f" {row.category}", "dim")),
            row.configuration,
            _tps(row),
            _speedup_cell(row),
            _pct(row.speculative.acceptance),
            f"{row.speculative.drafted}/{row.speculative.accepted}",
            _num(row.speculative.tokens_per_pass, ".2f"),
            f"{_num(row.alone.first_token_seconds, '.2f')}/"
            f"{_num(row.speculative.first_token_seconds, '.2f')} s",
            _output(row),
        ]
        table.add_row(*(cells if sweep else cells[:1] + cells[2:]))
    return table


def category_table(report: bench_report.BenchReport, sweep: bool) -> Table:
    best = bench_report.BenchReport.best(report.category_rows()) if sweep else {}
    table = _table("Per category (speedup: geometric mean of the per-prompt medians)")
    _add_columns(
        table,
        [
            "category",
            "config",
            "tok/s alone→spec",
            "speedup (95% CI)",
            "accept",
            "tok/pass",
            "time draft/verify/other",
            "identical",
            *(["of oracle"] if _has_oracle(report) else []),
        ],
        sweep,
    )
    for row in report.category_rows() + report.suite_rows():
        if row.scope == "suite" and (row.configuration == report.configurations[0].label):
            table.add_section()
        label = row.configuration + (" ★" if best.get(row.name) == row.configuration else "")
        cells: list[RenderableType] = [
            Text(row.name, style="bold" if row.scope == "suite" else ""),
            label,
            _tps(row),
            _speedup_cell(row),
            _pct(row.speculative.acceptance),
            _num(row.speculative.tokens_per_pass, ".2f"),
            _split(row.speculative),
            _identical(row),
            *([_pct(row.efficiency)] if _has_oracle(report) else []),
        ]
        table.add_row(*(cells if sweep else cells[:1] + cells[2:]))
    return table


def _has_oracle(report: bench_report.BenchReport) -> bool:
    return any(c.label == bench_configs.ORACLE for c in report.configurations)


_LEFT = ("prompt", "category", "config", "output")


def _add_columns(table: Table, names: list[str], sweep: bool) -> None:
    """The config column only when several configurations are compared; it never wraps."""
    for name in names:
        if name != "config" or sweep:
            table.add_column(
                name, justify="left" if name in _LEFT else "right", no_wrap=name == "config"
            )


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)


def _tps(row: bench_report.Row) -> str:
    return f"{_num(row.alone.tokens_per_second)} → {_num(row.speculative.tokens_per_second)}"


def _speedup_cell(row: bench_report.Row) -> Text:
    if row.speedup is None:
        return Text("–")
    return Text.assemble(_styled_speedup(row), (f" ({_interval(row)})", "dim"))


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
    lines += ["", "## Per category", ""]
    lines += _md_table(
        [
            "category",
            "config",
            "alone tok/s",
            "spec tok/s",
            "speedup",
            "95% CI",
            "accept",
            "tok/pass",
            "drafted/accepted",
            "time draft/verify/other",
            "identical",
            "of oracle",
        ],
        [
            [
                r.name,
                r.configuration,
                _num(r.alone.tokens_per_second),
                _num(r.speculative.tokens_per_second),
                _speedup(r),
                _interval(r),
                _pct(r.speculative.acceptance),
                _num(r.speculative.tokens_per_pass, ".2f"),
                f"{r.speculative.drafted}/{r.speculative.accepted}",
                _split(r.speculative),
                _identical(r),
                _pct(r.efficiency),
            ]
            for r in report.category_rows() + report.suite_rows()
        ],
    )
    lines += ["", "## Per prompt", ""]
    lines += _md_table(
        [
            "prompt",
            "category",
            "config",
            "prompt tokens",
            "alone tok/s",
            "spec tok/s",
            "speedup",
            "95% CI",
            "accept",
            "tok/pass",
            "drafted/accepted",
            "TTFT alone",
            "TTFT spec",
            "draft lengths",
            "output",
        ],
        [
            [
                r.name,
                r.category or "",
                r.configuration,
                _num(r.prompt_tokens, "d"),
                _num(r.alone.tokens_per_second),
                _num(r.speculative.tokens_per_second),
                _speedup(r),
                _interval(r),
                _pct(r.speculative.acceptance),
                _num(r.speculative.tokens_per_pass, ".2f"),
                f"{r.speculative.drafted}/{r.speculative.accepted}",
                _num(r.alone.first_token_seconds, ".3f", " s"),
                _num(r.speculative.first_token_seconds, ".3f", " s"),
                " ".join(f"{k}:{v}" for k, v in r.speculative.draft_lengths.items()),
                _output(r),
            ]
            for r in report.prompt_rows()
        ],
    )
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


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def strip_markup(text: str) -> str:
    return Text.from_markup(text).plain
