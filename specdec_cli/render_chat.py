"""`specdec chat` on screen: the answer in colours by who produced each token, the legend,
the stats line after each reply, and the session's commands' output."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .decoding.engine import FinishReason, GenerationStats, Piece, TokenKind
from .render import AnswerStream, print_stats, stats_summary

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
