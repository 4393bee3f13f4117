"""All terminal output: streamed answers, coloured tokens, stats lines, tables."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import IO, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .decoding.comparison import Comparison
from .decoding.engine import FinishReason, GenerationStats, Piece, TokenKind
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
    drafter step, in ms, as the run started and as it ended where they differ."""

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

CHAT_STYLES: dict[TokenKind, str] = {
    TokenKind.ACCEPTED: "green",
    TokenKind.CORRECTION: "yellow",
    TokenKind.BONUS: "cyan",
    TokenKind.TARGET: "",
}
CHAT_LEGEND = (
    (TokenKind.ACCEPTED, "accepted draft"),
    (TokenKind.CORRECTION, "target's correction"),
    (TokenKind.BONUS, "bonus token"),
    (TokenKind.TARGET, "target alone"),
)
CHAT_PROMPT = ">>> "


class ChatView:
    """`specdec chat` on screen. The answer goes to stdout, each piece in the colour of the
    kind of token that released it (as the engine labelled it); header, legend, stats,
    notices and errors go to stderr. Scripted mode (stdin not a terminal) writes the
    answer as plain text and styles nothing."""

    def __init__(self, out: Console, err: Console, *, plain: bool, show_stats: bool) -> None:
        self.out, self.err = out, err
        self.plain, self.show_stats = plain, show_stats
        self._answer = AnswerStream(out.file)
        self._at_line_start = True

    @classmethod
    def terminal(cls, no_color: bool = False) -> ChatView:
        """Rich decides colour: none with --no-color, NO_COLOR set, or a dumb/non-terminal.
        (no_color=None, not False, lets Rich read NO_COLOR.)"""
        out = Console(no_color=no_color or None, highlight=False, soft_wrap=True)
        err = Console(stderr=True, no_color=no_color or None, highlight=False, soft_wrap=True)
        return cls(out, err, plain=False, show_stats=True)

    @classmethod
    def scripted(cls) -> ChatView:
        out = Console(color_system=None, highlight=False, soft_wrap=True)
        err = Console(stderr=True, color_system=None, highlight=False, soft_wrap=True)
        return cls(out, err, plain=True, show_stats=err.is_terminal)

    def loading(self):
        if self.plain or not self.err.is_terminal:
            return contextlib.nullcontext()
        # Rich's no_color leaves the spinner green; style it only when colour is allowed.
        style = "none" if self.err.no_color else "status.spinner"
        return self.err.status("loading models…", spinner="dots", spinner_style=style)

    def header(self, target: str, drafter: str | None, drafting: bool) -> None:
        if self.plain:
            return
        pair = f"{drafter} drafting for {target}" if drafter else f"{target} alone"
        self.err.print(
            f"[bold]specdec chat[/bold] · {escape(pair)} · /help for commands, Ctrl-D to leave"
        )
        if drafting:
            self.legend()

    def legend(self) -> None:
        legend = Text()
        for i, (kind, label) in enumerate(CHAT_LEGEND):
            legend.append(" · " if i else "")
            legend.append(label, style=CHAT_STYLES[kind])
        self.err.print(legend)

    def piece(self, piece: Piece) -> None:
        if not piece.text:
            return
        if self.plain:
            self._answer.write(piece)
        else:
            self.out.print(Text(piece.text, style=CHAT_STYLES[piece.kind]), end="")
        self._at_line_start = piece.text.endswith("\n")

    def end_reply(self, stats: GenerationStats, finish_reason: FinishReason) -> None:
        if not self._at_line_start:
            if self.plain:
                self._answer.finish_line()
            else:
                self.out.print()
            self._at_line_start = True
        if self.show_stats:
            print_stats(self.err, stats, finish_reason)

    def notice(self, text: str) -> None:
        self.err.print(f"[yellow]{escape(text)}[/yellow]")

    def error(self, error: Exception) -> None:
        self.err.print(f"[bold red]error:[/bold red] {escape(str(error))}")

    def info(self, text: str) -> None:
        self.err.print(escape(text))

    def help(self, commands: dict[str, str]) -> None:
        width = max(map(len, commands))
        for name, what in commands.items():
            self.err.print(f"  [bold]{escape(name.ljust(width))}[/bold]  {escape(what)}")

    def session_stats(self, totals: GenerationStats, records: list) -> None:
        """Session totals, then one line per turn with what the backends decoded."""
        self.err.print(f"session: {len(records)} turns · {stats_summary(totals)}")
        for i, r in enumerate(records, 1):
            decoded = ", ".join(
                f"{who} {n}"
                for who, n in (("target", r.target_decoded), ("drafter", r.drafter_decoded))
                if n is not None
            )
            self.err.print(
                f"[dim]turn {i}: prompt {r.prompt_tokens} tokens ({r.reused_tokens} from cache)"
                f" · reply {r.reply_tokens} tokens · decoded: {decoded or 'n/a'}"
                + (f" · dropped {r.dropped_exchanges} old exchanges" if r.dropped_exchanges else "")
                + "[/dim]"
            )


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
