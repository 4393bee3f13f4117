"""How a download reports what it does, without drawing anything.

Nothing in models/ imports Rich: the hub and PyPI downloaders report through the small
`FetchProgress` protocol, rendered by specdec_cli/render_fetch.py; `SilentProgress` is the one
that shows nothing, for scripts and tests.
"""

from __future__ import annotations

from typing import Protocol


class FetchProgress(Protocol):
    """How fetch reports what it does; render_fetch.RichFetchProgress draws it."""

    def start(self, label: str, total: int | None) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def finish(self) -> None: ...
    def note(self, message: str) -> None: ...


class SilentProgress:
    """A FetchProgress that shows nothing (scripts, tests)."""

    def start(self, label: str, total: int | None) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass
