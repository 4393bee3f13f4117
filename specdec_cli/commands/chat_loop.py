"""`specdec chat`'s input side: reading lines (readline or a pipe), commands, Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .. import render, render_chat
from ..decoding.engine import Piece
from ..errors import SpecdecError
from ..models.loading import CHAT_CONTEXT, ModelLoader, load_with_llama_cpp
from ..request import DecodeRequest
from ..services.drafting import load_history
from ..services.lifecycle import loaded_pair
from .chat import (
    COMMANDS,
    CONSTRAINTS,
    ChatSession,
    Command,
    CommandError,
    parse_command,
    user_text,
)


@dataclass(frozen=True)
class ChatRequest:
    decode: DecodeRequest
    no_color: bool = False
    history: Path | None = None  # --history: a folder of earlier prompts and answers


def run_chat(
    request: ChatRequest,
    stdin: TextIO | None = None,
    loader: ModelLoader = load_with_llama_cpp,
) -> int:
    stdin = stdin or sys.stdin
    interactive = stdin.isatty()
    view = (
        render_chat.ChatView.terminal(request.no_color)
        if interactive
        else render_chat.ChatView.scripted()
    )
    decode = request.decode
    with ExitStack() as lifetime:
        with view.loading():
            loaded = lifetime.enter_context(loaded_pair(decode, loader))
            drafter = loaded.prepare(CHAT_CONTEXT)
            history = index = None
            if request.history is not None:
                history, index, damaged = load_history(request.history, decode.target)
                render.print_history_damage(render.stderr_console(), history.path, damaged)
        session = ChatSession(
            loaded.pair, decode.generation_settings(), decode.system, drafter, index, history
        )
        view.header(decode.target.stem, decode.drafter_label, session.drafting)
        _converse(session, view, stdin, interactive)
    return 0


def _converse(
    session: ChatSession, view: render_chat.ChatView, stdin: TextIO, interactive: bool
) -> None:
    lines = _terminal_lines() if interactive else _piped_lines(stdin)
    for line in lines:
        try:
            command = parse_command(line)
            if command is None:
                _reply(session, view, user_text(line), catch_interrupt=interactive)
            elif command.name == "exit":
                break
            else:
                _apply(command, session, view)
        except SpecdecError as error:  # a bad command or an oversized message: say so, go on
            view.error(error)


def _terminal_lines() -> Iterator[str]:
    """Lines typed at the prompt, with readline editing and history. Ctrl-D or Ctrl-C at
    the prompt ends the session."""
    with contextlib.suppress(ImportError):  # Windows has no readline; input() still works
        import readline  # noqa: F401  (importing it gives input() line editing and history)
    while True:
        try:
            line = input(render_chat.CHAT_PROMPT)
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if line.strip():
            yield line


def _piped_lines(stdin: TextIO) -> Iterator[str]:
    """One user message per line."""
    for line in stdin:
        if line.strip():
            yield line.rstrip("\n")


def _reply(
    session: ChatSession, view: render_chat.ChatView, text: str, catch_interrupt: bool
) -> None:
    turn = session.reply(text)
    if turn.dropped:
        view.notice(
            f"dropped the oldest {turn.dropped} exchange(s) to fit the context of "
            f"{session.pair.target.n_ctx} tokens (the system message stays)"
        )
    events = turn.events()
    try:
        with _CtrlC(enabled=catch_interrupt) as ctrl_c:
            for event in events:
                if isinstance(event, Piece):
                    view.piece(event)
                if ctrl_c.pressed:
                    break
    except KeyboardInterrupt:  # a second Ctrl-C, or scripted mode: stop now
        if not catch_interrupt:
            raise
    except SpecdecError as error:  # e.g. llama.cpp refused a decode: keep the conversation
        view.error(error)
    finally:
        events.close()
        if turn.record is None:
            turn.stop()
    record = turn.record
    assert record is not None  # set by the Finished event, or by stop()
    view.end_reply(record.stats, record.finish_reason)
    if session.history_problem:
        view.notice(f"history: {session.history_problem}; not storing answers any more")
        session.history_problem = None


class _CtrlC:
    """While a reply streams, the first Ctrl-C only sets a flag that the loop checks between
    events, so a llama.cpp call and the cache bookkeeping after it are never cut apart.
    A second Ctrl-C raises KeyboardInterrupt as usual."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.pressed = False

    def __enter__(self) -> _CtrlC:
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


def _apply(command: Command, session: ChatSession, view: render_chat.ChatView) -> None:
    if command.name == "help":
        view.help(COMMANDS)
    elif command.name == "reset":
        session.reset()
        view.info("conversation cleared")
    elif command.name == "system":
        session.set_system(command.value)
        view.info("system message " + ("set" if command.value else "removed"))
    elif command.name == "draft":
        session.set_draft_max(command.value)
        view.info(
            f"drafting up to {command.value} tokens per round"
            if command.value
            else "drafting off: the target alone"
        )
    elif command.name == "temp":
        session.set_temperature(command.value)
        view.info(f"temperature {command.value:g}")
    elif command.name in CONSTRAINTS:
        session.constrain(command.name, command.value)
        view.info(f"answers follow {command.value}" if command.value else "answers are free again")
    elif command.name == "predict":
        n_tokens = session.predict(command.value)
        view.info(f"the next answer is predicted by {command.value} ({n_tokens} tokens)")
    elif command.name == "stats":
        view.session_stats(session.totals, session.records)
    elif command.name == "save":
        view.info(f"saved {session.save(command.value)}")
    else:  # parse_command only returns the names above
        raise CommandError(f"unhandled command /{command.name}.")
