"""Drafting with a model of another vocabulary, by text (SmolLM2 drafting for Qwen).

The drafter reads the same text as the target, in its own tokens, and proposes how it goes
on; that text is cut into whole target tokens, which the target verifies like any draft.
The acceptance rules see only target token ids and the target's own logits, so what a draft
holds changes how many tokens a pass keeps, never which: answers stay the target alone's.
Text drafts are point drafts (as n-gram drafts are), so the classic rule stays exact in
distribution.

Keeping the drafter in step with the accepted text costs only its changed tail: the tokens
of the drafter's own stream that still spell a prefix of the text are kept (and their KV
cache with them), the rest of the text is tokenised again and decoded in one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .backend import CacheAgreement, Choices, Decoder
from .drafters import (
    Draft,
    DrafterTimings,
    DraftSource,
    KeepGoing,
    Outcome,
    only_grown,
    step_choices,
)
from .sampling import Distribution, SamplingSettings, TokenChooser

# When the drafter's context is full, it starts again from the most recent text, about
# this fraction of its context: one batched decode of that text every so many tokens,
# instead of no drafts at all once a long answer outgrows a drafter of a shorter context.
REWINDOW_FRACTION = 0.5


@runtime_checkable
class Spelling(Protocol):
    """What drafting by text needs of a model's vocabulary."""

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes:
        """The token's text; empty for control tokens (<|im_start|>, end of turn)."""
        ...

    def token_spelling(self, token: int) -> bytes:
        """The token's text with control tokens spelled out (b"<|im_start|>")."""
        ...

    def is_end_of_generation(self, token: int) -> bool: ...


class TextModel(Decoder, Spelling, Protocol):
    """A drafter that drafts by text: a Decoder with its own vocabulary."""


def is_control(model: Spelling, token: int) -> bool:
    """A control token: it has a spelling but no text (never proposed as text)."""
    return not model.token_bytes(token) and bool(model.token_spelling(token))


def utf8_complete(data: bytes | bytearray) -> int:
    """How many leading bytes of `data` are whole UTF-8 characters (a character split
    across tokens leaves its first bytes at the end)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its character fit?
            need = (
                1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            )
            return n if back >= need else n - back
    return n


def at_char_boundary(data: bytes | bytearray, offset: int) -> bool:
    return offset >= len(data) or data[offset] & 0xC0 != 0x80


@dataclass
class TargetText:
    """The target's text so far, kept in step with its growing context. The prompt's
    control tokens are spelled out (the drafter reads the same turn markers); its BOS is
    left out (the drafter starts with its own)."""

    model: Spelling
    bos: int | None = None
    tokens: list[int] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    prompt_length: int = 0
    prompt_bytes: int = 0  # where the answer's text begins
    _context: Sequence[int] | None = field(default=None, init=False, repr=False)  # last synced

    def sync(self, context: Sequence[int], prompt_length: int) -> bool:
        """Whether the text started again (another request, an edited history). The engine's
        growing list (only_grown) is not compared again: a 32,000-token context took 160 µs
        a round on the Xeon."""
        known = len(self.tokens)
        restarted = prompt_length != self.prompt_length
        if not restarted and not only_grown(context, self._context, known):
            restarted = list(context[:known]) != self.tokens
        self._context = context
        if restarted:
            self.tokens, self.data, known = [], bytearray(), 0
            self.prompt_length = prompt_length
        for i in range(known, len(context)):
            token = int(context[i])
            self.tokens.append(token)
            if i < prompt_length:
                self.data += b"" if token == self.bos else self.model.token_spelling(token)
                self.prompt_bytes = len(self.data)
            else:
                self.data += self.model.token_bytes(token)
        return restarted


@dataclass
class DrafterStream:
    """The drafter's own tokens for the text from `base` on (its BOS first, if it adds one),
    and the text they spell: what its KV cache holds, or will after one decode."""

    tokens: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # where each token's text ends
    spelling: bytearray = field(default_factory=bytearray)  # the text from `base` on
    base: int = 0

    def spelled(self, upto: int) -> int:
        """Where the stream's first `upto` tokens end in the text."""
        return self.ends[upto - 1] if upto else self.base

    def cut(self, keep: int) -> None:
        del self.tokens[keep:], self.ends[keep:]
        del self.spelling[self.spelled(keep) - self.base :]

    def append(self, token: int, piece: bytes) -> None:
        self.tokens.append(token)
        self.ends.append(self.spelled(len(self.ends)) + len(piece))
        self.spelling += piece


@dataclass
class TextDrafter:
    """Drafts by text with a model of another vocabulary: see the module's docstring."""

    model: TextModel
    target: Spelling
    target_bos: int | None = None  # left out of the text the drafter reads
    drafter_bos: int | None = None  # what the drafter starts its own stream with
    source: DraftSource = DraftSource.TEXT
    steps: int = field(default=0, init=False)
    timings: DrafterTimings = field(default_factory=DrafterTimings, init=False)
    text: TargetText = field(init=False)
    stream: DrafterStream = field(default_factory=DrafterStream, init=False)
    _prompt_length: int = field(default=0, init=False)
    _synced_tokens: int = field(default=0, init=False)
    # how much of the stream the drafter's cache holds (logits_for_suffix): a step compares
    # only the tokens the stream gained since it was last cut (_sync_stream, which follows
    # every restart)
    _cache: CacheAgreement = field(default_factory=CacheAgreement, init=False, repr=False)

    def __post_init__(self) -> None:
        self.text = TargetText(self.target, self.target_bos)

    # -- the Drafter protocol --------------------------------------------------------------

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        return self.grow(context, max_tokens, sampling, chooser, lambda k, sure: True)

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self._prompt_length = prompt_length

    def observe(self, outcome: Outcome) -> None:
        pass

    def behind(self, context: Sequence[int]) -> int:
        """About how many tokens the drafter must decode before it can draft after
        `context`: the target tokens accepted since it last drafted."""
        return max(0, len(context) - self._synced_tokens)

    # -- drafting --------------------------------------------------------------------------

    def grow(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
        keep_going: KeepGoing,
    ) -> Draft:
        """Up to `max_tokens` target tokens of the drafter's greedy continuation, grown one
        drafter token at a time while `keep_going(k, confidence)` says the k-th is worth it.
        Text drafts are the drafter's argmax whatever the sampling: a guess at the target's
        choice, kept by the rules only where the target makes it."""
        self._synced_tokens = len(context)
        if self.text.sync(context, self._prompt_length) and self.stream.base:
            self._restart(0)  # another text: a stream of the last one's end shares nothing
        held_back = self._sync_stream(max_tokens)
        if held_back is None:
            return Draft.empty()
        proposed, following = self._continue(held_back, max_tokens, keep_going)
        return self._as_target_draft(proposed, following, max_tokens)

    def _sync_stream(self, max_tokens: int) -> bytes | None:
        """Bring the stream to the text: keep what still spells it, tokenise the rest. The
        bytes held back from the stream's end (see _tokenize_tail); None when no draft can
        start here: the text ends inside a character, or there is no text at all."""
        data = self.text.data
        if not data or utf8_complete(data) < len(data):
            return None  # the target's next token finishes a character: nothing to propose
        if not self.stream.tokens and not self.stream.base:
            self._restart(0)  # the first text: the stream starts with the drafter's BOS
        keep = self._kept_tokens()
        if self._full(keep, max_tokens):
            self._restart(self._recent_start())
            keep = self._kept_tokens()
        self.stream.cut(keep)
        self._cache.changed_from(keep)
        tail, held_back = self._tokenize_tail(self.stream.spelled(keep), len(data))
        for token in tail:
            self.stream.append(token, self.model.token_spelling(token))
        return held_back if self.stream.tokens else None

    def _kept_tokens(self) -> int:
        """How many stream tokens still spell a prefix of the text, ending where the text
        has a character boundary (its re-tokenised rest must start at one)."""
        stream, data = self.stream, self.text.data
        text = np.frombuffer(bytes(data[stream.base :]), dtype=np.uint8)
        spelled = np.frombuffer(bytes(stream.spelling), dtype=np.uint8)
        n = min(len(text), len(spelled))
        differ = np.flatnonzero(text[:n] != spelled[:n])
        common = stream.base + (int(differ[0]) if differ.size else n)
        keep = int(np.searchsorted(stream.ends, common, side="right"))
        while keep and not at_char_boundary(data, stream.spelled(keep)):
            keep -= 1
        return max(keep, self._bos_tokens())

    def _bos_tokens(self) -> int:
        return int(self.stream.tokens[:1] == [self.drafter_bos])

    def _full(self, keep: int, max_tokens: int) -> bool:
        """Whether the text's tail and a draft might overflow the drafter's context (the
        tail estimated at two bytes a token)."""
        tail = (len(self.text.data) - self.stream.spelled(keep)) // 2
        return keep + tail + max_tokens + 2 > self.model.n_ctx

    def _recent_start(self) -> int:
        """Where a restarted stream begins: about REWINDOW_FRACTION of the drafter's context
        before the text's end, at the start of a line where there is one."""
        data = self.text.data
        base = max(self.stream.base, len(data) - int(2 * self.model.n_ctx * REWINDOW_FRACTION))
        newline = data.find(b"\n", base, len(data) - 1)
        if newline >= 0:
            base = newline + 1
        while not at_char_boundary(data, base):
            base += 1
        return base

    def _restart(self, base: int) -> None:
        self.stream = DrafterStream(base=base)
        bos = self.drafter_bos
        if bos is not None:
            self.stream.append(bos, b"")

    def _tokenize_tail(self, start: int, end: int) -> tuple[list[int], bytes]:
        """The drafter's tokens for text[start:end] (the prompt's part read with its control
        tokens, the answer's as plain text), and the bytes of a last answer token of
        whitespace only, held back: the drafter would rather merge it into the next word."""
        data, answer = self.text.data, self.text.prompt_bytes
        tokens: list[int] = []
        if start < min(end, answer):
            tokens += self.model.tokenize(bytes(data[start:answer]).decode(), False, True)
            start = answer
        if start >= end:
            return tokens, b""
        written = self.model.tokenize(bytes(data[start:end]).decode(), False, False)
        if self.model.token_bytes(written[-1]).isspace():
            return tokens + written[:-1], self.model.token_bytes(written[-1])
        return tokens + written, b""

    def _continue(
        self, held_back: bytes, max_tokens: int, keep_going: KeepGoing
    ) -> tuple[list[tuple[bytes, float]], bytes | None]:
        """Step the drafter from its stream: each piece of text it proposes with its
        confidence, and the text it would write next, where a step computed it (b"" where
        its turn ends; None where unknown). Its first steps must spell `held_back` again;
        if they spell something else, it proposes nothing."""
        proposed: list[tuple[bytes, float]] = []
        pending = held_back
        steps = min(self.model.n_ctx - len(self.stream.tokens) - 1, max_tokens + len(held_back))
        for _ in range(max(0, steps)):
            choices = self._step(self.stream.tokens)
            token, sure = choices[0], choices.confidence(0)
            if self.model.is_end_of_generation(token) or is_control(self.model, token):
                return proposed, None if pending else b""  # its turn ends: the draft too
            piece = self.model.token_bytes(token)
            if pending:
                common = min(len(pending), len(piece))
                if piece[:common] != pending[:common]:
                    return [], None
                pending, piece = pending[common:], piece[common:]
            elif not keep_going(len(proposed), sure):
                return proposed, piece
            self.stream.append(token, self.model.token_spelling(token))
            if piece:
                proposed.append((piece, sure))
            if len(proposed) >= max_tokens:
                break
        return proposed, None

    def _step(self, sequence: Sequence[int]) -> Choices:
        """Its choice after `sequence`, with the choice's probability (where its model takes
        choices on its device, only those come back)."""
        self.steps += 1
        return step_choices(self.model, sequence, self.timings, self._cache)

    def _as_target_draft(
        self, proposed: list[tuple[bytes, float]], following: bytes | None, max_tokens: int
    ) -> Draft:
        """The proposed text as whole target tokens: read by the target's tokenizer with
        the text the drafter would write next (`following`), to the last whole character,
        and kept while the tokens spell the proposed text. Where what follows is unknown,
        the last token is dropped: the next text may extend it."""
        data = b"".join(piece for piece, _ in proposed)
        if not data:
            return Draft([], [], self.source)
        read = data + (following or b"")
        usable = utf8_complete(read)
        tokens = self.target.tokenize(read[:usable].decode(), False, False) if usable else []
        kept: list[int] = []
        ends: list[int] = []
        for token in tokens:
            at = ends[-1] if ends else 0
            piece = self.target.token_bytes(token)
            if not piece or at + len(piece) > len(data) or data[at : at + len(piece)] != piece:
                break
            kept.append(token)
            ends.append(at + len(piece))
        cut_short = following is None or usable < len(data) + min(1, len(following))
        if kept and cut_short and ends[-1] == min(usable, len(data)):
            kept.pop()
            ends.pop()
        kept, ends = kept[:max_tokens], ends[:max_tokens]
        dists = [Distribution.point(token) for token in kept]
        return Draft(kept, dists, self.source, _confidences(proposed, ends))


def _confidences(proposed: list[tuple[bytes, float]], ends: list[int]) -> list[float]:
    """Each target token's confidence: the least of the drafter's for the text it spans."""
    pieces, at = [], 0
    for piece, sure in proposed:
        pieces.append((at, at + len(piece), sure))
        at += len(piece)
    out, begin = [], 0
    for end in ends:
        out.append(min(sure for first, last, sure in pieces if last > begin and first < end))
        begin = end
    return out
