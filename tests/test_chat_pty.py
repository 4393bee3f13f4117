"""`specdec chat` driven in a pseudo-terminal with the tiny GGUF models: colours on the right
tokens, the stats line, cache reuse across turns, Ctrl-C, /reset, context overflow.

Every wait is bounded (`Terminal.expect` fails with the screen's tail after TIMEOUT) and
every child is killed at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from prompt_reuse import assert_exact_reuse

from specdec_cli.commands.chat import ChatSession
from specdec_cli.decoding.backend import encode_template_text
from specdec_cli.decoding.engine import GenerationSettings, Piece, TokenKind
from specdec_cli.models.loading import load_pair
from specdec_cli.request import HardwareOptions

SPECDEC = [sys.executable, "-m", "specdec_cli"]  # works without the console script
TIMEOUT = 20.0
PROMPT = b">>> "
SGR = {
    TokenKind.ACCEPTED: "\x1b[32m",
    TokenKind.CORRECTION: "\x1b[33m",
    TokenKind.BONUS: "\x1b[36m",
}
RESET = "\x1b[0m"
DOT = " \u00b7 ".encode()
STATS_LINE = re.compile(rb"\d+ tokens%s[\d.]+ tok/s%sdrafted \d+%saccepted \d+" % (DOT, DOT, DOT))
TURN_LINE = re.compile(
    r"turn (\d+): prompt (\d+) tokens \((\d+) from cache\) · reply (\d+) tokens · "
    r"decoded: target (\d+), drafter (\d+)"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

FIRST = "hello there"
SECOND = "how are you today"


def _take_terminal() -> None:
    """In the child: make the pty its controlling terminal, so ^C in the input sends SIGINT."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
        environment = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
        environment["TERM"] = "xterm-256color"
        environment.update(env or {})
        self.proc = subprocess.Popen(
            [*SPECDEC, "chat", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        self.fd = master
        self.output = b""
        self.mark = 0  # expect() searches from here

    def send(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def line(self, text: str) -> None:
        self.send(text + "\r")

    def expect(self, pattern: bytes | re.Pattern, timeout: float = TIMEOUT) -> re.Match:
        regex = pattern if isinstance(pattern, re.Pattern) else re.compile(re.escape(pattern))
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.output, self.mark)
            if match:
                self.mark = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                tail = self.output[-1500:].decode(errors="replace")
                raise AssertionError(f"no {regex.pattern!r} in {timeout} s; screen ends:\n{tail}")

    def since(self, start: int) -> str:
        return self.output[start:].decode(errors="replace").replace("\r\n", "\n")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.output += data
        return bool(data)

    def wait(self, timeout: float = TIMEOUT) -> int:
        """The child's exit status, reading what it still writes meanwhile."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.05)
        if self.proc.poll() is None:
            tail = self.output[-1500:].decode(errors="replace")
            raise AssertionError(f"still running after {timeout} s; screen ends:\n{tail}")
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        os.close(self.fd)


@pytest.fixture
def terminal():
    opened: list[Terminal] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Terminal:
        opened.append(Terminal(list(args), env))
        return opened[-1]

    yield start
    for t in opened:
        t.close()


def pair_args(models, *extra: str) -> list[str]:
    """The tiny pair, drafting --draft-max tokens a round like ChatSession's default drafter."""
    return [
        *("-t", str(models.target), "-d", str(models.close_drafter)),
        *("--drafter", "fixed", "--threads", "1", *extra),
    ]


def expected_first_turn(models, message: str, max_tokens: int) -> tuple[list[Piece], int]:
    """The first turn's pieces as the engine labels them, run in-process on the same pair,
    and how many tokens the template adds between that reply and the second message."""
    pair = load_pair(models.target, models.close_drafter, HardwareOptions(ctx_size=4096, threads=1))
    session = ChatSession(pair, GenerationSettings(max_tokens=max_tokens))
    turn = session.reply(message)
    pieces = [e for e in turn.events() if isinstance(e, Piece) and e.text]
    rendered = pair.target.format_chat(session.messages(SECOND))
    tail = rendered[len(pair.target.format_chat(session.messages()[:-1])) :]
    tail = tail[len(session.exchanges[0].assistant) :]
    return pieces, len(encode_template_text(pair.target, tail))


def coloured(pieces: list[Piece]) -> str:
    """What the terminal must show for these pieces: each in its kind's SGR colour."""
    return "".join(
        p.text if p.kind is TokenKind.TARGET else f"{SGR[p.kind]}{p.text}{RESET}" for p in pieces
    )


def test_two_turns_colours_stats_cache_reuse_and_reset(tiny_models, terminal):
    pieces, tail_tokens = expected_first_turn(tiny_models, FIRST, 30)
    kinds = {p.kind for p in pieces}
    assert {TokenKind.ACCEPTED, TokenKind.CORRECTION} <= kinds, "the pair must agree and disagree"
    assert all(p.text.isprintable() for p in pieces), "control characters would be stripped"

    t = terminal(*pair_args(tiny_models, "-n", "30"))
    t.expect(PROMPT)
    legend = t.since(0)
    assert f"{SGR[TokenKind.ACCEPTED]}accepted draft{RESET}" in legend
    assert f"{SGR[TokenKind.CORRECTION]}target's correction{RESET}" in legend

    start = t.mark
    t.line(FIRST)
    t.expect(STATS_LINE)
    t.expect(PROMPT)
    assert coloured(pieces) in t.since(start)  # every piece, in order, in its own colour

    t.line(SECOND)
    t.expect(STATS_LINE)
    t.expect(PROMPT)
    t.line("/stats")
    t.expect(re.compile(rb"turn 2: .*\n"))
    turns = [tuple(map(int, m.groups())) for m in TURN_LINE.finditer(ANSI.sub("", t.since(0)))]
    assert len(turns) == 2
    (_, p1, cached1, r1, _, _), (_, p2, cached2, r2, target2, drafter2) = turns
    assert cached1 == 0
    # Turn 2's prompt starts with turn 1's prompt and reply. Exact mode keeps only what a
    # fresh prefill computes the same way, so the answer does not depend on the cache
    # (tests/test_prompt_cache_independence.py, tests/prompt_reuse.py).
    assert_exact_reuse(cached2, p1, p2)
    assert p2 == p1 + r1 + tail_tokens  # the history is kept as tokens
    new = p2 - cached2
    # The target decoded the new prompt tokens plus, per round, at most draft_max + 1 tokens.
    assert new + r2 <= target2 <= new + r2 * 9

    t.line("/reset")
    t.expect(b"conversation cleared")
    t.expect(PROMPT)
    start = t.mark
    t.line(FIRST)
    t.expect(STATS_LINE)
    t.expect(PROMPT)
    assert coloured(pieces) in t.since(start)  # same answer: the history is gone
    t.line("/stats")
    t.expect(re.compile(rb"turn 3: prompt (\d+) tokens"))
    third = TURN_LINE.findall(ANSI.sub("", t.since(0)))[-1]
    assert int(third[1]) == p1  # the prompt is the first turn's again

    t.expect(PROMPT)
    t.send("\x04")  # Ctrl-D
    assert t.wait() == 0


def test_ctrl_c_stops_the_reply_and_keeps_the_conversation(tiny_models, terminal):
    t = terminal(*pair_args(tiny_models, "-n", "100000", "-c", "4096"))
    t.expect(PROMPT)
    t.line(FIRST)
    t.expect(re.compile(rb"\x1b\[32m"))  # the reply has started streaming
    t.send("\x03")
    t.expect(re.compile(rb"stopped: interrupted"))
    t.expect(PROMPT)

    t.line(SECOND)
    t.expect(re.compile(rb"\x1b\[32m"))
    t.send("\x03")
    t.expect(re.compile(rb"stopped: interrupted"))
    t.expect(PROMPT)
    t.line("/stats")
    t.expect(re.compile(rb"turn 2: .*\n"))
    turns = [tuple(map(int, m.groups())) for m in TURN_LINE.finditer(ANSI.sub("", t.since(0)))]
    (_, p1, _, r1, _, _), (_, p2, cached2, _, _, _) = turns
    assert 0 < r1 < 3000  # stopped well before -n or the context
    assert p2 > p1 + r1  # the partial reply stayed in the conversation
    # and the cache kept the first prompt
    assert_exact_reuse(cached2, p1, p2)

    t.expect(PROMPT)
    # Ctrl-C at the prompt leaves. CPython's readline can miss a SIGINT that lands while it
    # is still drawing the prompt (before it waits for input), so press it again if needed.
    for _ in range(5):
        t.send("\x03")
        with contextlib.suppress(AssertionError):
            assert t.wait(timeout=2) == 0
            break
    else:
        raise AssertionError("Ctrl-C at the prompt did not end the session")


def test_a_conversation_longer_than_the_context_keeps_working(tiny_models, terminal):
    t = terminal(*pair_args(tiny_models, "-n", "40", "-c", "256", "--system", "be brief"))
    t.expect(PROMPT)
    for i in range(8):
        t.line(f"message number {i} about the model and the data")
        t.expect(STATS_LINE)
        t.expect(PROMPT)
    screen = t.since(0)
    assert "dropped the oldest" in screen
    assert "Traceback" not in screen and "error" not in screen
    t.line("/exit")
    assert t.wait() == 0


def test_no_color_and_NO_COLOR_turn_colour_off(tiny_models, terminal):
    for args, env in ((["--no-color"], None), ([], {"NO_COLOR": "1"})):
        t = terminal(*pair_args(tiny_models, "-n", "20", *args), env=env)
        t.expect(PROMPT)
        t.line(FIRST)
        t.expect(STATS_LINE)
        t.expect(PROMPT)
        t.line("/exit")
        assert t.wait() == 0
        screen = t.since(0)
        assert not re.search(r"\x1b\[(3\d|38;)", screen), "a foreground colour was written"


def test_a_dumb_terminal_gets_no_colour(tiny_models, terminal):
    t = terminal(*pair_args(tiny_models, "-n", "20"), env={"TERM": "dumb"})
    t.expect(PROMPT)
    t.line(FIRST)
    t.expect(STATS_LINE)
    t.expect(PROMPT)
    t.line("/exit")
    assert t.wait() == 0
    assert not re.search(r"\x1b\[(3\d|38;)", t.since(0))
