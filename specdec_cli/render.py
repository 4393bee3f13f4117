"""All terminal output: streamed answers, coloured tokens, stats lines, tables."""

from __future__ import annotations

import json
from typing import TextIO

from rich.console import Console

from .comparison import Comparison
from .engine import GenerationStats, Piece


def stderr_console(no_color: bool = False) -> Console:
    return Console(stderr=True, no_color=no_color, highlight=False)


class AnswerStream:
    """Answer text to a stream (stdout), flushed piece by piece so pipes see it live."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._ends_with_newline = True

    def write(self, piece: Piece) -> None:
        if piece.text:
            self._stream.write(piece.text)
            self._stream.flush()
            self._ends_with_newline = piece.text.endswith("\n")

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
    parts.append(f"{stats.tokens_per_pass:.2f} tokens/pass")
    if stats.first_token_seconds is not None:
        parts.append(f"first token {stats.first_token_seconds:.2f} s")
    return " · ".join(parts)


def print_stats(console: Console, stats: GenerationStats, finish_reason: str) -> None:
    reason = "" if finish_reason in ("stop", "stop_string") else f" · stopped: {finish_reason}"
    console.print(f"[dim]{stats_summary(stats)}{reason}[/dim]", soft_wrap=True)


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
