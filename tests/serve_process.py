"""`python -m specdec_cli serve` as a child process, for the server tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app


class ServerProcess:
    """`python -m specdec_cli serve` on a free port; stderr collected line by line."""

    def __init__(self, *args: str, home: Path | None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if home is not None:
            env["SPECDEC_HOME"] = str(home)
        env.pop("SPECDEC_API_KEY", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli", "serve", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._listening.wait(300):
            self.stop()
            pytest.fail("the server did not start:\n" + "\n".join(self.lines))

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                self._listening.set()
        self._listening.set()  # the process ended: stop waiting

    def log(self) -> list[dict]:
        """The --json-log lines so far."""
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def wait_for_log(self, predicate, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [record for record in self.log() if predicate(record)]
            if found:
                return found[-1]
            time.sleep(0.05)
        raise AssertionError("no such log line:\n" + "\n".join(self.lines))

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a user stops it; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("the server did not stop within the timeout") from None


def health(server: ServerProcess) -> dict:
    """/health (no key needed)."""
    return httpx.get(server.url + "/health", timeout=60).json()


def wait_for_health(server: ServerProcess, predicate, timeout: float = 120.0) -> dict:
    """Poll /health until `predicate` holds; the timeout only catches a hang."""
    deadline = time.monotonic() + timeout
    while True:
        state = health(server)
        if predicate(state):
            return state
        assert time.monotonic() < deadline, f"the server never got there ({state})"
        time.sleep(0.005)


def run_json(*args: str) -> dict:
    """`specdec run ARGS --json`, in process: its JSON answer."""
    result = CliRunner().invoke(app, ["run", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
