"""render_bench: the terminal's results tables and the Markdown report's, on a made-up report
(no model: every number is chosen, so the tables are exact)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from rich.text import Text

from specdec_cli.bench import bench_configs, bench_report, render_bench
from specdec_cli.bench.bench_prompts import BenchPrompt
from specdec_cli.decoding.comparison import Comparison
from specdec_cli.decoding.engine import GenerationStats

PROMPTS = [
    BenchPrompt("greet", "prose", text="hello"),
    BenchPrompt("chat", "code", text="def f"),
    BenchPrompt("short", "code", text="print"),
]


def fake_report(labels: list[str]) -> bench_report.BenchReport:
    """Two repeats of each prompt on each side, with numbers that differ from row to row."""
    configurations = [
        bench_configs.Configuration(label, draft_max=2 + i) for i, label in enumerate(labels)
    ]
    report = bench_report.BenchReport(
        settings={}, prompts=PROMPTS, configurations=configurations, repeats=2
    )
    n = 0
    for p in PROMPTS:
        report.prompt_tokens[p.id] = 5 + len(p.id)
        for repeat in range(2):
            for j, side in enumerate(report.sides):
                n += 1
                if side == bench_configs.TARGET_ALONE:
                    stats = GenerationStats(
                        generated=20,
                        target_passes=20,
                        seconds=1 + 0.07 * n,
                        first_token_seconds=0.0123 * (repeat + 1),
                    )
                else:
                    stats = GenerationStats(
                        generated=20,
                        drafted=30 + 3 * j,
                        accepted=15 + repeat,
                        target_passes=9 + j,
                        seconds=0.5 + 0.071 * j + 0.013 * n,
                        first_token_seconds=0.2 + 0.011 * n,
                        draft_seconds=0.1,
                        verify_seconds=0.27,
                        draft_lengths=Counter({2: 4, 4: 5 + j}),
                    )
                report.runs.append(
                    bench_report.RunRecord(
                        p.id, p.category, side, repeat, 0, [1], "x", "length", stats
                    )
                )
        for j, label in enumerate(labels):
            same = (j + len(p.id)) % 2 == 0
            comparison = Comparison(True, None, None) if same else Comparison(False, 3 + j, 0.4567)
            report.checks[(p.id, label)] = bench_report.OutputCheck(comparison, 2 - j % 2, 2)
    return report


TOKEN = re.compile(r"\d+(?:\.\d+)?|[A-Za-z][\w-]*")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def shows(terminal: str, markdown: str) -> bool:
    """The terminal's word or number is the Markdown's, or the Markdown's number rounded."""
    if terminal == markdown:
        return True
    if not (terminal[0].isdigit() and markdown[0].isdigit()):
        return False
    decimals = len(terminal.partition(".")[2])
    return len(markdown.partition(".")[2]) >= decimals and (
        round(float(markdown), decimals) == float(terminal)
    )


def in_order(terminal: list[str], markdown: list[str]) -> bool:
    """Every terminal token, in order, among the Markdown's (which may hold more)."""
    rest = iter(markdown)
    return all(any(shows(t, m) for m in rest) for t in terminal)


def plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def terminal_rows(table: render_bench.ResultsTable, report) -> list[list[str]]:
    rich_table = render_bench.terminal_table(table, report, render_bench.View.of(report))
    columns = [[plain(cell) for cell in column.cells] for column in rich_table.columns]
    return [list(row) for row in zip(*columns, strict=True)]


def markdown_rows(markdown: str, title: str) -> list[list[str]]:
    lines = markdown.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.strip("|").split(" | ") for line in lines[2:]]


@pytest.mark.parametrize("labels", [["fixed k=2", "fixed k=4", "oracle"], ["combined"]])
@pytest.mark.parametrize("table", [render_bench.PROMPTS, render_bench.CATEGORIES])
def test_the_markdown_shows_every_terminal_cell_in_the_terminals_order(labels, table):
    report = fake_report(labels)
    on_terminal = terminal_rows(table, report)
    in_markdown = markdown_rows(render_bench.markdown(report), table.title)
    assert len(on_terminal) == len(in_markdown) > 0
    for cells, md_cells in zip(on_terminal, in_markdown, strict=True):
        assert in_order(tokens(" ".join(cells)), tokens(" ".join(md_cells))), (cells, md_cells)


def test_the_terminal_shows_config_and_oracle_columns_only_when_they_say_something():
    def headers(report, table):
        view = render_bench.View.of(report)
        return [str(c.header) for c in render_bench.terminal_table(table, report, view).columns]

    sweep, single = fake_report(["fixed k=2", "oracle"]), fake_report(["combined"])
    assert "config" in headers(sweep, render_bench.PROMPTS)
    assert "of oracle" in headers(sweep, render_bench.CATEGORIES)
    assert "config" not in headers(single, render_bench.PROMPTS)
    assert "of oracle" not in headers(single, render_bench.CATEGORIES)
    # the Markdown keeps its columns whatever ran: one header for every report
    md = render_bench.markdown(single)
    assert "| category | config | alone tok/s |" in md and "| identical | of oracle |" in md
