"""Terminal output: streamed answers, stats lines, tables (chat's view is render_chat.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .decoding.comparison import Comparison
from .decoding.engine import FinishReason, GenerationStats, Piece
from .services.history_file import HistorySummary


def stderr_console(no_color: bool = False) -> Console:
    # None, not False, when colour is allowed: False would override the NO_COLOR variable.
    return Console(stderr=True, no_color=no_color or None, highlight=False)


def stdout_console() -> Console:
    return Console(highlight=False)


class AnswerStream:
    """Answer text to a stream (stdout), flushed piece by piece so pipes see it live."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._ends_with_newline = True

    def write(self, piece: Piece) -> None:
        self.write_text(piece.text)

    def write_text(self, text: str) -> None:
        if text:
            self._stream.write(text)
            self._stream.flush()
            self._ends_with_newline = text.endswith("\n")

    def finish_line(self) -> None:
        if not self._ends_with_newline:
            self._stream.write("\n")
            self._stream.flush()
            self._ends_with_newline = True


def stats_summary(stats: GenerationStats) -> str:
    parts = [f"{stats.generated} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.drafted:
        parts += [
            f"drafted {stats.drafted}",
            f"accepted {stats.accepted} ({100 * stats.acceptance:.1f}%)",
        ]
    if stats.accepted_prediction_tokens or stats.rejected_prediction_tokens:
        parts.append(
            f"prediction {stats.accepted_prediction_tokens} accepted, "
            f"{stats.rejected_prediction_tokens} rejected"
        )
    parts.append(f"{stats.tokens_per_pass:.2f} tokens/pass")
    if stats.first_token_seconds is not None:
        parts.append(f"first token {stats.first_token_seconds:.2f} s")
    return " · ".join(parts)


def print_stats(console: Console, stats: GenerationStats, finish_reason: FinishReason) -> None:
    ended = finish_reason in (FinishReason.STOP, FinishReason.STOP_STRING)
    reason = "" if ended else f" · stopped: {finish_reason}"
    console.print(f"[dim]{stats_summary(stats)}{reason}[/dim]", soft_wrap=True)


def costs_summary(costs: dict) -> str:
    """A cost table (CostModel.as_dict) in one line: each size's target decode and the
    drafter step, in ms, as the run started and as it ended where they differ, and the
    price of the drafter's catch-up where it was measured."""

    def moved(before: float, after: float) -> str:
        return f"{before:.0f}" if round(before) == round(after) else f"{before:.0f}→{after:.0f}"

    started, now = costs["started"], costs["now"]
    sizes = [
        f"{n}: {moved(started['target_decode_ms'].get(n, ms), ms)}"
        for n, ms in now["target_decode_ms"].items()
    ]
    step = ""
    if now["draft_step_ms"]:
        step = f" · drafter step {moved(started['draft_step_ms'], now['draft_step_ms'])}"
    if catch_up := now.get("catch_up"):
        step += f" · catch-up {catch_up['fixed_ms']:.1f} + {catch_up['token_ms']:.2f} a token"
    observed = sum(costs["observed"].values())
    return (
        f"decode costs, ms by tokens ({costs['origin']}; {observed} decodes timed): "
        + " · ".join(sizes)
        + step
    )


def print_costs(console: Console, costs: dict) -> None:
    console.print(f"[dim]{escape(costs_summary(costs))}[/dim]", soft_wrap=True)


def print_history(console: Console, folder: Path, summaries: list[HistorySummary]) -> None:
    if not summaries:
        console.print(f"No history in {folder}.")
        return
    for s in summaries:
        damaged = f", {s.damaged} damaged line(s) skipped" if s.damaged else ""
        console.print(
            f"{s.path}: {s.documents} documents, {s.tokens} tokens, "
            f"{s.bytes / 1e6:.2f} MB{damaged}",
            soft_wrap=True,
        )


def print_history_damage(console: Console, path: Path, damaged: int) -> None:
    if damaged:
        console.print(
            f"[yellow]history:[/yellow] skipped {damaged} damaged line(s) of {escape(str(path))}.",
            soft_wrap=True,
        )


def print_warning(console: Console, label: str, message: str) -> None:
    console.print(f"[yellow]{escape(label)}:[/yellow] {escape(message)}", soft_wrap=True)


def print_skipped_cache_files(console: Console, paths: list[Path]) -> None:
    """Prompt-cache files that were damaged or not ours: skipped, never trusted."""
    if paths:
        console.print(
            f"[yellow]prompt cache:[/yellow] skipped {len(paths)} damaged or foreign "
            f"file(s), e.g. {escape(str(paths[0]))}; delete them to save the space.",
            soft_wrap=True,
        )


def comparison_summary(comparison: Comparison, plain_tps: float, speculative_tps: float) -> str:
    speed = f"target alone {plain_tps:.1f} tok/s, speculative {speculative_tps:.1f} tok/s"
    if comparison.identical:
        return f"verify: identical to the target alone ({speed})"
    return (
        f"verify: differs from the target alone at token {comparison.first_difference}, where "
        f"the target's top-2 logit margin is {comparison.top2_margin:.3f} ({speed})"
    )


def print_json(stream: TextIO, record: dict) -> None:
    stream.write(json.dumps(record, ensure_ascii=False) + "\n")
    stream.flush()


# ---- specdec chat ---------------------------------------------------------------------------


def print_optimisation(console: Console, result, target_name: str) -> None:
    """The requantised drafter next to the original: step time and acceptance."""
    table = Table(title=f"drafter for {target_name}", title_justify="left", box=None)
    for column in ("model", "file", "step ms", "acceptance"):
        table.add_column(column, justify="left" if column in ("model", "file") else "right")
    for label, measured in (("original", result.original), ("requantised", result.optimised)):
        table.add_row(
            label,
            measured.path.name,
            f"{measured.step_ms:.1f}",
            f"{100 * measured.acceptance:.0f}%",
        )
    console.print(table)
    speed = result.original.step_ms / result.optimised.step_ms
    console.print(
        f"[dim]{result.name}: {speed:.2f}x the drafting speed; recorded in your models.yaml. "
        f"Use it with --draft {result.name} (or its -q4_0 alias).[/dim]",
        soft_wrap=True,
    )
