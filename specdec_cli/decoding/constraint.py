"""Decoding under a constraint (a grammar): the target's choice at each position among the
tokens the constraint allows, for the target alone and speculative decoding alike.

Greedy: the masked argmax. Sampling: the masked logits through the same filters (top-k,
top-p, min-p, temperature) and the same rule. A full mask over a 152k-token vocabulary
costs about as much as a target step on a CPU (39-116 ms with llama.cpp's grammar engine on
the AVX2 machine, against 83 ms), while asking about one token costs 20-35 us; so the
tokens are asked about in order of their logits, a few at a time, and only as many as the
choice needs (usually one: the model's favourite is allowed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ..structured import StructureError
from .sampling import Distribution, SamplingSettings, distribution, likeliest

# Tokens asked about at once, in order of their logits, until the choice is made: the
# favourite alone first, then ever larger slices, then all the rest.
ASK_SLICES = (1, 16, 256, 4096)
# The most characters of forced text looked for at once: a tool call's scaffold up to its
# first free value is about 40 (`<tool_call>\n{"name": "get_weather", "arguments": {"`, with
# the spaces the grammar leaves free cutting it), and each costs a query of the printable
# characters (~90 us with llama.cpp's grammar over Qwen2.5's vocabulary, AVX2 EPYC).
FORCED_MAX_CHARS = 48
# Where the grammar leaves only the layout free (whitespace, or one other character: JSON's
# `space` rule between tokens), the forced text goes on as the answer (and the prompt) laid
# out the same few characters last time: the character after the most recent earlier
# occurrence of the text's last LAYOUT_CONTEXT characters, or of fewer where those never
# occurred. Without it a schema's forced drafts end at every optional space, one key long.
LAYOUT_CONTEXT = 8


class Constraint(Protocol):
    """Which tokens may come next, given those accepted so far."""

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """A boolean per id of `ids`: whether it may come next (end of generation included,
        once the constraint is satisfied)."""
        ...

    def accept(self, token: int) -> None:
        """`token` comes next (it must be allowed)."""
        ...

    def copy(self) -> Constraint: ...

    def forced_tokens(self, written: str = "", seen: Collection[int] = ()) -> list[int]:
        """Target tokens spelling text the constraint forces next (see forced_draft_tokens;
        where only the layout is free, laid out as `written`, the text so far, lays it
        out; `seen`: the tokens of the answer so far)."""
        ...


class NoTokenAllowed(StructureError):
    """The constraint allows no token of the vocabulary here (a grammar no text can end)."""


def allowed_best(row: np.ndarray, constraint: Constraint, count: int | None) -> np.ndarray:
    """The `count` allowed tokens with the largest logits (None: all allowed), in
    descending order of logits (ties: lower id first)."""
    n = row.shape[-1]
    wanted = n if count is None else count
    found: list[np.ndarray] = []
    asked = count_found = 0
    for end in (*ASK_SLICES, n):
        end = min(end, n)
        if end <= asked:
            continue
        ids = _best_ids(row, asked, end)
        found.append(ids[constraint.allowed(ids)])
        asked, count_found = end, count_found + len(found[-1])
        if count_found >= wanted:
            break
    allowed = np.concatenate(found)[:wanted]
    if not len(allowed):
        raise NoTokenAllowed(
            "the grammar allows no token of the model's vocabulary here.",
            "Check that every rule can be written with the model's tokens.",
        )
    return allowed


def _best_ids(row: np.ndarray, start: int, end: int) -> np.ndarray:
    """The token ids ranked start..end-1 by descending logit, ties by ascending id: one
    total order, so consecutive slices neither repeat nor skip a tied token."""
    if end - start == 1 and start == 0:
        return np.array([int(np.argmax(row))], dtype=np.int32)  # argmax: the lowest id of ties
    return likeliest(row, end)[start:end].astype(np.int32)


def masked_distribution(
    row: np.ndarray, settings: SamplingSettings, constraint: Constraint
) -> Distribution:
    """What `distribution` gives for the row with every disallowed token's logit at -inf."""
    if settings.greedy:
        return Distribution.point(int(allowed_best(row, constraint, 1)[0]))
    k = settings.top_k if 0 < settings.top_k < row.shape[-1] else None
    ids = allowed_best(row, constraint, k)
    masked = np.full(row.shape[-1], -np.inf, dtype=np.float32)
    masked[ids] = row[ids]
    if len(ids) < (k or 0):  # fewer allowed than top-k: the filters see only those
        settings = replace(settings, top_k=len(ids))
    return distribution(masked, settings)


class ConstrainedDistributions(Sequence):
    """The target's masked distributions for a verified draft's rows, computed in order and
    only for the rows the acceptance rule reaches: row i is masked by the constraint as it
    stands after the draft's first i tokens. The constraint itself moves on as the rows are
    masked (a rule reaches row i only when it kept the draft's first i tokens)."""

    def __init__(
        self,
        rows: np.ndarray,
        sampling: SamplingSettings,
        constraint: Constraint,
        draft: Sequence[int],
    ) -> None:
        self._rows, self._sampling, self._draft = rows, sampling, draft
        self._constraint = constraint
        self._computed: list[Distribution] = []
        self._walked = 0  # the draft tokens the constraint has accepted

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        while len(self._computed) <= i:
            self.accept_kept(len(self._computed))
            row = self._rows[len(self._computed)]
            self._computed.append(masked_distribution(row, self._sampling, self._constraint))
        return self._computed[i]

    def accept_kept(self, n: int) -> None:
        """Move the constraint on to after the draft's first `n` tokens (kept ones only)."""
        assert n >= self._walked, "the constraint went past the tokens kept"
        for token in self._draft[self._walked : n]:
            self._constraint.accept(token)
        self._walked = n


def allowed_prefix(draft: Sequence[int], constraint: Constraint) -> int:
    """How many of the draft's first tokens the constraint allows in a row: those after the
    first disallowed one would be verified for nothing (the target cannot choose it)."""
    walker = constraint.copy()
    for i, token in enumerate(draft):
        if not walker.allowed(np.array([token], dtype=np.int32))[0]:
            return i
        walker.accept(token)
    return len(draft)


@dataclass(frozen=True)
class ForcedText:
    """What a constraint forces from here: `text`, and `end`, the end-of-generation token
    that must come right after it where the constraint is satisfied there and allows no
    further character (else None)."""

    text: str
    end: int | None = None


def forced_text(constraint: Constraint, characters: Mapping[int, str], written: str = "") -> str:
    return forced_path(constraint, characters, written).text


def forced_path(
    constraint: Constraint,
    characters: Mapping[int, str],
    written: str = "",
    end_tokens: Sequence[int] = (),
) -> ForcedText:
    """The text the constraint allows alone from here: while exactly one of the
    single-character tokens `characters` (id: its character) is allowed, that character;
    where only the layout is free, the character `written` (the text so far) suggests
    (layout_guess), or the grammar's own whitespace (grammar_whitespace); at most
    FORCED_MAX_CHARS. Where no character but whitespace may follow, the first of
    `end_tokens` allowed there ends it (an answer ends at its closing brace, not a space
    after it). Asked on a copy. A grammar that also allows a longer token or a
    character outside `characters` there only makes this a guess, which the target
    verifies like any draft."""
    walker = constraint.copy()
    ids = np.fromiter(characters, dtype=np.int32, count=len(characters))
    text = ""
    while len(text) < FORCED_MAX_CHARS:
        allowed = ids[walker.allowed(ids)]
        if all(characters[int(i)].isspace() for i in allowed):  # then the end, if it may
            end = _first_allowed(walker, end_tokens)
            if end is not None or not len(allowed):
                return ForcedText(text, end)
        token = _next_character(walker, allowed, characters, written + text)
        if token is None:
            break
        text += characters[token]
        walker.accept(token)
    return ForcedText(text)


def forced_draft_tokens(
    constraint: Constraint,
    characters: Mapping[int, str],
    spell: Callable[[str], list[int]],
    written: str = "",
    end_tokens: Sequence[int] = (),
    seen: Collection[int] = (),
) -> list[int]:
    """The forced text (forced_path) in target tokens (`spell`). Where more follows, the
    last of them is left out unless the answer so far has it (`seen`): the target may write
    it merged with what follows (`":` where the grammar forces `"`, `": ` spelled as one),
    but one it wrote before as a token of its own (the space before a number, `' "'`
    before a string) it will likely write so again. Where the constraint ends after it, all
    of it and the end token: a tool call's closing tag and the end of the answer in the
    same pass as its last value's closing brackets."""
    forced = forced_path(constraint, characters, written, end_tokens)
    tokens = spell(forced.text) if forced.text else []
    if forced.end is not None:
        return [*tokens, forced.end]
    return tokens if tokens and tokens[-1] in seen else tokens[:-1]


def _next_character(
    walker: Constraint, allowed: np.ndarray, characters: Mapping[int, str], text: str
) -> int | None:
    if len(allowed) == 1:
        return int(allowed[0])
    options = {characters[int(i)]: int(i) for i in allowed}
    guess = (
        layout_guess("".join(options), text)
        or grammar_whitespace(walker, options, characters)
        or closing_layout("".join(options), text)
    )
    return options[guess] if guess is not None else None


def _first_allowed(walker: Constraint, tokens: Sequence[int]) -> int | None:
    if not tokens:
        return None
    ids = np.asarray(tokens, dtype=np.int32)
    allowed = ids[walker.allowed(ids)]
    return int(allowed[0]) if len(allowed) else None


def grammar_whitespace(
    walker: Constraint, options: Mapping[str, int], characters: Mapping[int, str]
) -> str | None:
    """Where only whitespace may come and the text so far says nothing of it: the one
    option after which something else may come at once, the grammar's own (the newline
    before a tool call's closing tag) rather than a layout's optional space. None where
    not exactly one is."""
    if not all(option.isspace() for option in options):
        return None
    ids = np.fromiter(characters, dtype=np.int32, count=len(characters))
    leading = []
    for option, token in options.items():
        twin = walker.copy()
        twin.accept(token)
        following = ids[twin.allowed(ids)]
        if any(not characters[int(i)].isspace() for i in following):
            leading.append(option)
    return leading[0] if len(leading) == 1 else None


def closing_layout(options: str, text: str) -> str | None:
    """Where whitespace or a closing bracket may come and the text so far says nothing of
    it: the bracket closed as the last one of its kind was opened (`{"a": 1}`, `{ "a": 1 }`).
    None where more than the layout is free or no such bracket was opened."""
    others = [c for c in options if not c.isspace()]
    if len(others) != 1 or others[0] not in _OPENERS:
        return None
    closer = others[0]
    if text[-1:].isspace():
        return closer
    opened = text.rfind(_OPENERS[closer])
    if opened < 0 or opened + 1 >= len(text):
        return None
    following = text[opened + 1]
    if not following.isspace():
        return closer
    return following if following in options else None


_OPENERS = {"}": "{", "]": "["}


def plain_spelling(
    text: str, tokenize: Callable[[str], list[int]], added_text: Callable[[int], str | None]
) -> list[int]:
    """`text` in target tokens, with the vocabulary's added tokens (Qwen2.5's
    `<tool_call>`, `</tool_call>`: `added_text` gives their text, None for other tokens)
    spelled as plain text. Under a grammar Qwen2.5-Coder 1.5B writes its tags so (`</`,
    `tool`, `_call`, `>`), and a draft with the tag's own token would be rejected there."""
    tokens = tokenize(text)
    for token in tokens:
        piece = added_text(token)
        if piece is not None and len(piece) > 1:
            split = text.find(piece) + len(piece) - 1  # the tag, short of its last character
            return tokenize(text[:split]) + plain_spelling(text[split:], tokenize, added_text)
    return tokens


def layout_guess(options: str, text: str) -> str | None:
    """Which of `options` comes next, where they are all whitespace but at most one other
    character: as after the most recent earlier occurrence of `text`'s last characters
    (LAYOUT_CONTEXT, or fewer where those never occurred), the whitespace that followed it,
    or where no whitespace did, the one other option. None where more than the layout is
    free, where `text` says nothing, or where what it says is not an option."""
    others = [c for c in options if not c.isspace()]
    if len(others) > 1:
        return None
    for n in range(min(LAYOUT_CONTEXT, len(text) - 1), 0, -1):
        at = text.rfind(text[-n:], 0, len(text) - 1)  # an occurrence followed by a character
        if at >= 0:
            following = text[at + n]
            if not following.isspace():
                return others[0] if others else None
            return following if following in options else None
    return None
