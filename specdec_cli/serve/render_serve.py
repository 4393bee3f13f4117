"""`specdec serve`'s output on stderr: the start-up lines and one line per request."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from ..decoding.engine import GenerationStats


@dataclass
class RequestRecord:
    """What the log says about one request."""

    method: str
    path: str
    started: float  # time.perf_counter() when the request arrived
    status: int = 200
    stream: bool = False
    id: str | None = None  # the response's id, once there is one
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None  # the engine's ("interrupted": the client went away)
    stats: GenerationStats | None = None
    error: str | None = None

    def as_dict(self, seconds: float) -> dict:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "stream": self.stream,
            "seconds": round(seconds, 4),
        }
        if self.id is not None:
            record["id"] = self.id
        if self.prompt_tokens is not None:
            record |= {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens}
        if self.stats is not None:
            s = self.stats
            record |= {
                "completion_tokens": s.generated,
                "tokens_per_second": round(s.tokens_per_second, 3),
                "drafted": s.drafted,
                "accepted": s.accepted,
                "acceptance": round(s.acceptance, 4),
                "tokens_per_pass": round(s.tokens_per_pass, 4),
                "accepted_prediction_tokens": s.accepted_prediction_tokens,
                "rejected_prediction_tokens": s.rejected_prediction_tokens,
                "finish_reason": self.finish_reason,
            }
        if self.error is not None:
            record["error"] = self.error
        return record


def request_line(record: dict) -> str:
    """One human-readable line: method, status, tokens, speed, acceptance."""
    head = f"{record['time'][11:19]} {record['method']} {record['path']} {record['status']}"
    parts = [head + (" stream" if record["stream"] else "")]
    if "prompt_tokens" in record:
        parts.append(f"prompt {record['prompt_tokens']} (cached {record['cached_tokens']})")
    if "completion_tokens" in record:
        parts.append(
            f"{record['completion_tokens']} tokens {record['tokens_per_second']:.1f} tok/s"
        )
        if record["drafted"]:
            parts.append(
                f"accepted {record['accepted']}/{record['drafted']} "
                f"({100 * record['acceptance']:.0f}%)"
            )
        parts.append(f"{record['tokens_per_pass']:.2f} tok/pass")
        predicted = record["accepted_prediction_tokens"] + record["rejected_prediction_tokens"]
        if predicted:
            parts.append(f"prediction {record['accepted_prediction_tokens']}/{predicted}")
        parts.append(str(record["finish_reason"]))
    if "error" in record:
        parts.append(record["error"])
    parts.append(f"{record['seconds']:.2f} s")
    return " · ".join(parts)


class RequestLog:
    """Writes one line per request to `stream` (stderr): text, or JSON with --json-log."""

    def __init__(self, stream: TextIO, *, json_lines: bool) -> None:
        self._stream = stream
        self._json = json_lines

    def write(self, record: RequestRecord) -> None:
        fields = record.as_dict(time.perf_counter() - record.started)
        line = json.dumps(fields, ensure_ascii=False) if self._json else request_line(fields)
        self._stream.write(line + "\n")
        self._stream.flush()

    def notice(self, message: str) -> None:
        """A line about the server rather than one request (JSON: {"time", "notice"})."""
        if self._json:
            fields = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "notice": message}
            line = json.dumps(fields, ensure_ascii=False)
        else:
            line = f"{time.strftime('%H:%M:%S')} note: {message}"
        self._stream.write(line + "\n")
        self._stream.flush()


def print_network_warning(console: Console, host: str, has_key: bool) -> None:
    if has_key:
        message = f"serving on {host}: the API is reachable from the network (--api-key required)."
    else:
        message = (
            f"serving on {host} opens the API to the network: anyone who can reach this port "
            "can use it. Set --api-key, or bind 127.0.0.1."
        )
    console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)


def print_listening(console: Console, url: str, model_id: str, drafter: str | None) -> None:
    drafting = f", drafted by {drafter}" if drafter else ""
    console.print(
        f"specdec serve: {escape(model_id)}{escape(drafting)} listening on {url} "
        "(OpenAI API at /v1; Ctrl-C stops)",
        soft_wrap=True,
        highlight=False,
    )
