"""Rounds: several requests' threads sharing one llama.cpp context (serve --parallel).

Each request decodes in its own KV sequence of one context. Their generated rows (a next
token, or a draft to verify) go into one `llama_decode` per round: a round runs once every
request that is generating has handed in its rows, so a pass reads the weights once for
all of them. Whatever else uses the context in between (a prompt's chunks, which must be
decoded alone to stay exact, and the drafters' steps) takes a turn of its own: one at a
time, so the two cores are never asked to run two decodes at once, and never ahead of a
round that is ready.

Pure threading, no llama.cpp: the round's decode is the function given (sequences.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..decoding.backend import Backend


@dataclass
class Part:
    """One request's rows in a round: `tokens` appended to sequence `seq` of the context
    `pool` (0: the target's; see Rounds.add_pool), logits wanted for the last `n_logits` of
    them (0: all)."""

    seq: int
    tokens: Sequence[int]
    pool: int = 0
    n_logits: int = 0
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class RoundStats:
    rounds: int = 0
    rows: int = 0  # rows decoded in rounds, all requests together
    parts: int = 0  # requests' parts in them (parts / rounds: how many shared a pass)
    turns: int = 0  # decodes outside the rounds (prompt chunks, drafters)
    largest: int = 0  # the most requests in one round
    padding: int = 0  # rows decoded only to shape rounds (SequencesMixin._decode_round)
    round_seconds: float = 0.0  # decoding rounds
    turn_seconds: float = 0.0  # decoding turns
    drafter_rounds: int = 0  # rounds of the drafters' steps (the second pool)
    drafter_parts: int = 0  # requests' steps in them
    drafter_seconds: float = 0.0

    def add(self, parts: int, rows: int, seconds: float) -> None:
        self.rounds += 1
        self.round_seconds += seconds
        self.parts += parts
        self.rows += rows
        self.largest = max(self.largest, parts)


class Rounds:
    def __init__(self, decode_together: Callable[[list[Part]], int | None]) -> None:
        """`decode_together(parts)` decodes every part's tokens in one pass and sets each
        part's `logits` (raising if the pass failed); it returns how many rows of padding
        it decoded with them (None: none)."""
        self._decoders = [decode_together]  # by pool
        self._changed = threading.Condition()
        self._busy = False  # a decode is running on the context
        self._turns_waiting = 0
        self._last_was_round = False
        self._generating: set[int] = set()  # sequences that take part in rounds
        self._waiting: dict[int, Part] = {}  # their rows for the next round
        # each sequence's last round: how many others were in it, and the most rows of one
        self._alongside: dict[int, tuple[int, int]] = {}
        self.stats = RoundStats()

    def add_pool(self, decode_together: Callable[[list[Part]], int | None]) -> int:
        """Another context whose parts take part in rounds (the slots' drafters): its
        number for `submit`. A round of its parts runs once every generating sequence waits
        for a round of one pool or the other, before the target's (whose parts cannot go
        on until the drafters' have), so the drafters' steps of several requests share a
        decode as their verifications do."""
        with self._changed:
            self._decoders.append(decode_together)
            return len(self._decoders) - 1

    # -- rounds ------------------------------------------------------------------------------

    def join(self, seq: int) -> None:
        """Sequence `seq` takes part in rounds from now until `leave(seq)`: no round runs
        without its rows. `submit` joins; a prompt being decoded has not yet (its chunks
        take turns between the others' rounds)."""
        with self._changed:
            self._generating.add(seq)

    def submit(
        self, seq: int, tokens: Sequence[int], pool: int = 0, n_logits: int = 0
    ) -> np.ndarray:
        """Decode `tokens` for sequence `seq` of context `pool` in the next round of its
        pool (joining the rounds); the logits of the last `n_logits` (0: all)."""
        part = Part(seq, tokens, pool, n_logits)
        with self._changed:
            if seq in self._waiting:
                raise RuntimeError(f"sequence {seq} already waits for a round")
            self._generating.add(seq)
            self._waiting[seq] = part
            self._changed.notify_all()
            batch = self._wait_or_lead(part)
        if batch is not None:
            self._run(batch)
        if part.error is not None:
            raise part.error
        assert part.logits is not None
        return part.logits

    def _wait_or_lead(self, part: Part) -> list[Part] | None:
        """Under the lock: wait until the round holding `part` has run (None), or until it
        is ready to run and nobody else runs it: then this thread runs it (its parts)."""
        while not part.done:
            ready = not self._busy and self._round_ready() and not self._turn_is_due()
            if ready and part.pool == self._next_pool():
                batch = [p for _, p in sorted(self._waiting.items()) if p.pool == part.pool]
                for p in batch:
                    del self._waiting[p.seq]
                self._busy = True
                return batch
            self._changed.wait()
        return None

    def _next_pool(self) -> int:
        """The pool whose parts go next: a drafters' round before the target's."""
        return max(p.pool for p in self._waiting.values())

    def _turn_is_due(self) -> bool:
        """A turn waits and a round ran last: the turn goes next. Rounds and turns that
        both wait alternate, so a prompt being decoded is not starved by rounds that are
        ready again as soon as one ends (nor the rounds by its chunks)."""
        return self._turns_waiting > 0 and self._last_was_round

    def _round_ready(self) -> bool:
        return bool(self._waiting) and self._generating <= self._waiting.keys()

    def _run(self, batch: list[Part]) -> None:
        began = time.perf_counter()
        padding = 0
        try:
            padding = self._decoders[batch[0].pool](batch) or 0
        except BaseException as error:  # every request in the pass hears of it
            for part in batch:
                part.error = error
        finally:
            with self._changed:
                self._last_was_round = True
                self._count(batch, padding, time.perf_counter() - began)
                for part in batch:
                    part.done = True
                self._busy = False
                self._changed.notify_all()

    def _count(self, batch: list[Part], padding: int, seconds: float) -> None:
        """A round's statistics, and (the target's) who shared it with whom."""
        if batch[0].pool:
            self.stats.drafter_rounds += 1
            self.stats.drafter_parts += len(batch)
            self.stats.drafter_seconds += seconds
            return
        self.stats.add(len(batch), sum(len(part.tokens) for part in batch), seconds)
        self.stats.padding += padding
        for part in batch:
            others = [len(p.tokens) for p in batch if p is not part]
            self._alongside[part.seq] = (len(others), max(others, default=0))

    def alongside(self, seq: int) -> tuple[int, int]:
        """The other requests sequence `seq`'s next rows will share a pass with, as far as
        can be told: how many (those in its last round, and at least every other sequence
        taking part now) and the most rows one of them decodes (as in its last round, at
        least one). (0, 0): alone."""
        with self._changed:
            others = len(self._generating - {seq})
            if not others:
                return 0, 0
            lanes, width = self._alongside.get(seq, (0, 0))
            return max(lanes, others), max(width, 1)

    def leave(self, seq: int) -> None:
        """Sequence `seq` ends its request: rounds no longer wait for it."""
        with self._changed:
            self._generating.discard(seq)
            self._waiting.pop(seq, None)
            self._alongside.pop(seq, None)
            self._changed.notify_all()

    @contextmanager
    def taking_part(self, seq: int) -> Iterator[None]:
        """One request on sequence `seq`: it leaves the rounds however the request ends."""
        try:
            yield
        finally:
            self.leave(seq)

    # -- turns -------------------------------------------------------------------------------

    @contextmanager
    def turn(self) -> Iterator[None]:
        """The context (and the cores) for one decode outside the rounds, once no decode
        runs; a round that is ready goes first, unless the last decode was a round."""
        with self._changed:
            self._turns_waiting += 1
            self._changed.notify_all()
            while self._busy or (self._round_ready() and not self._last_was_round):
                self._changed.wait()
            self._turns_waiting -= 1
            self._busy = True
            self.stats.turns += 1
        began = time.perf_counter()
        try:
            yield
        finally:
            with self._changed:
                self.stats.turn_seconds += time.perf_counter() - began
                self._busy = False
                self._last_was_round = False
                self._changed.notify_all()


class SequenceView(Backend, Protocol):
    """One sequence of a split context: a backend whose generated rows go into rounds."""

    @property
    def rounds(self) -> Rounds | None:
        """The rounds it shares with the context's other sequences."""
        ...

    def alongside(self) -> tuple[int, int]:
        """How many others its next rows share a pass with, and the most rows of one."""
        ...


@runtime_checkable
class SharedContexts(Protocol):
    """A backend whose context can hold several requests' sequences (LlamaBackend)."""

    def split(
        self,
        n_sequences: int,
        pass_cost: Callable[[int], float] | None = None,
        rounds: Rounds | None = None,
    ) -> list[SequenceView]:
        """A backend for each of `n_sequences` sequences of one context. `pass_cost`:
        seconds for a decode of n rows of one sequence (shapes the rounds). `rounds`: those
        of another split context, which this one's steps join as a pool of their own (the
        slots' drafters)."""
        ...
