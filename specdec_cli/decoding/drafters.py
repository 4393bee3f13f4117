"""Ways to propose draft tokens for the target to verify."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np

from .backend import CacheAgreement, Choices, Decoder, choices_for_suffix, logits_for_suffix
from .ngram import TokenScan
from .sampling import Distribution, SamplingSettings, TokenChooser, distribution


class DraftSource(str, Enum):
    """Where a round's draft came from (the engine counts rounds by it; bench shows them)."""

    __str__ = str.__str__  # shown as "ngram", not "DraftSource.NGRAM"

    NONE = "none"  # no draft: the target's own step
    MODEL = "model"  # a draft model of the target's vocabulary
    TEXT = "text"  # a draft model of another vocabulary, drafting by text (text_drafter)
    NGRAM = "ngram"  # prompt lookup: what followed an earlier match in the text
    PREDICTION = "prediction"  # the request's Predicted Output
    HISTORY = "history"  # earlier prompts and answers (history.py)
    EXPLORE = "explore"  # a filler the planner verifies to time a decode size (adaptive.py)
    FORCED = "forced"  # text a grammar forces next (constraint.py)
    ORACLE = "oracle"  # bench's ceiling: the target alone's own answer


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distribution each was drawn from (needed by the exact rule).

    `confidences` (model drafts) and `match_length` (n-gram drafts) let an adaptive
    drafter learn how often drafts like this one are accepted."""

    tokens: list[int]
    dists: list[Distribution]
    source: DraftSource
    confidences: list[float] = field(default_factory=list)
    match_length: int = 0
    # A forced draft's continuation: another source's draft of what follows the forced
    # text, its tokens the last of `tokens` (then).
    after: Draft | None = None

    @classmethod
    def empty(cls) -> Draft:
        return cls([], [], DraftSource.NONE)

    @property
    def own_length(self) -> int:
        """Its tokens from its own source (all but a continuation's)."""
        return len(self.tokens) - (len(self.after.tokens) if self.after is not None else 0)

    def then(self, after: Draft) -> Draft:
        """This draft and `after` (another source's draft of what follows it) as one."""
        if not after.tokens:
            return self
        return Draft(
            self.tokens + after.tokens,
            self.dists + after.dists,
            self.source,
            self.confidences,
            self.match_length,
            after,
        )

    def cut(self, n: int) -> Draft:
        """Its first `n` tokens (none: no draft at all)."""
        if n <= 0:
            return Draft.empty()
        own = self.own_length
        mine = Draft(
            self.tokens[: min(n, own)],
            self.dists[: min(n, own)],
            self.source,
            self.confidences[:n],
            self.match_length,
        )
        if self.after is None or n <= own:
            return mine
        return mine.then(self.after.cut(n - own))


@dataclass(frozen=True)
class Outcome:
    """What the target made of a draft."""

    draft: Draft
    n_accepted: int
    verify_seconds: float
    includes_prompt: bool  # the first round also decoded the prompt: not a verify cost
    draft_seconds: float = 0.0  # what proposing it took


# The draft sources a model drafter gives: by token ids, and by text (text_drafter).
MODEL_SOURCES = (DraftSource.MODEL, DraftSource.TEXT)

# Whether a model drafter should add its k-th draft token (0-based), given its confidence
# in it: decided before the token is drawn (see ModelDrafter.grow).
KeepGoing = Callable[[int, float], bool]


@runtime_checkable
class Drafter(Protocol):
    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft: ...

    def observe(self, outcome: Outcome) -> None:
        """Called after each verification, with what the target made of the draft."""
        ...

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        """A new answer starts after `prompt_length` tokens of context; `prediction` (often
        empty) is text the answer is expected to mostly repeat (Predicted Outputs)."""
        ...


@runtime_checkable
class ForcedPlanner(Protocol):
    """A drafter that weighs text a constraint forces next as a draft source of its own
    (adaptive.AdaptiveDrafter); another drafter's forced drafts are all of it."""

    def plan_forced(self, forced: Sequence[int], ends: bool = False) -> Draft:
        """As much of `forced` (the target's tokens; `ends`: its last ends the answer) as
        is worth verifying."""
        ...


@dataclass
class DrafterTimings:
    """A model drafter's decodes, timed: its plain steps (one new token each), and its
    catch-ups (a step that first reads the tokens it lacks: the prompt, or the text since it
    last drafted) as (tokens read besides the step's own, seconds)."""

    steps: list[float] = field(default_factory=list)
    catch_ups: list[tuple[int, float]] = field(default_factory=list)

    def clear(self) -> None:
        self.steps.clear()
        self.catch_ups.clear()


class GrowingDrafter(Protocol):
    """A model drafter the adaptive planner grows token by token: ModelDrafter (the
    target's vocabulary) or text_drafter.TextDrafter (another one, by text)."""

    steps: int
    timings: DrafterTimings  # its decodes since the planner last read them

    def grow(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
        keep_going: KeepGoing,
    ) -> Draft: ...

    def behind(self, context: Sequence[int]) -> int: ...


@dataclass
class ModelDrafter:
    """A small model run ahead of the target, one token per decode.

    With `min_confidence`, drafting stops when the drafter's probability for its likeliest
    token falls below it (llama.cpp's p_min). `AdaptiveDrafter` steps it token by token.
    """

    backend: Decoder
    min_confidence: float = 0.0
    steps: int = field(default=0, init=False)
    timings: DrafterTimings = field(default_factory=DrafterTimings, init=False)
    # The context last drafted after, and the drafter's own copy of it with that draft: of
    # the engine's growing list (only_grown) only what it gained is copied and compared with
    # the cache (a whole 12,000-token context took about 100 µs a draft on a 2-core Xeon, 9%
    # of a 0.5B step on a GPU); any other list is copied whole.
    _followed: Sequence[int] | None = field(default=None, init=False, repr=False)
    _followed_length: int = field(default=0, init=False, repr=False)
    _sequence: list[int] = field(default_factory=list, init=False, repr=False)
    _cache: CacheAgreement = field(default_factory=CacheAgreement, init=False, repr=False)

    def next_distribution(
        self, sequence: Sequence[int], sampling: SamplingSettings
    ) -> tuple[Distribution, float]:
        """The drafter's distribution for the token after `sequence`, and its confidence: a
        greedy draft's is its raw softmax probability, read with the choice (where the
        backend takes choices on its device, only those come back)."""
        if sampling.greedy:
            choices = step_choices(self.backend, sequence, self.timings, self._cache)
            self.steps += 1
            return Distribution.point(choices[0]), choices.confidence(0)
        row = step_logits(self.backend, sequence, self.timings, self._cache)
        self.steps += 1
        dist = distribution(row, sampling)
        return dist, float(dist.probs[0])

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        return self.grow(
            context, max_tokens, sampling, chooser, lambda k, sure: sure >= self.min_confidence
        )

    def grow(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
        keep_going: KeepGoing,
    ) -> Draft:
        """Up to `max_tokens` drafted tokens, while `keep_going(k, confidence)` says so."""
        draft = DraftBuilder(DraftSource.MODEL)
        sequence = self._follow(context)
        for k in range(max_tokens):
            dist, sure = self.next_distribution(sequence, sampling)
            # Decide before drawing: a stop that depends on the drawn token would bias the
            # drafts the exact rule sees, and answers would no longer follow the target.
            if not keep_going(k, sure):
                break
            token = draft.add(dist, sure, chooser, position=len(sequence))
            sequence.append(token)
            if self.backend.is_end_of_generation(token):
                break
        return draft.build()

    def _follow(self, context: Sequence[int]) -> list[int]:
        """`context` as the drafter's own list, which its draft then grows."""
        known = self._followed_length
        if only_grown(context, self._followed, known):
            del self._sequence[known:]  # the last draft
            self._sequence += context[known:]
        else:
            known = 0
            self._sequence = list(context)
        self._cache.changed_from(known)
        self._followed, self._followed_length = context, len(context)
        return self._sequence

    def behind(self, context: Sequence[int]) -> int:
        """How many tokens its cache lacks before it can draft after `context`."""
        return max(0, len(context) - 1 - len(self.backend.cached))

    def observe(self, outcome: Outcome) -> None:
        pass

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        pass


def only_grown(context: Sequence[int], last: Sequence[int] | None, known: int) -> bool:
    """Whether `context` is the list a drafter last read, `last`, still holding the `known`
    tokens it read then: the engine hands every round of an answer its one growing list,
    only appended to past where the round began, so those need not be compared again. A
    wrong guess could only draft worse: the target checks every draft."""
    return context is last and len(context) >= known


def step_logits(
    backend: Decoder,
    sequence: Sequence[int],
    timings: DrafterTimings,
    agreement: CacheAgreement | None = None,
) -> np.ndarray:
    """One drafter step: its logits for the token after `sequence`, its time in `timings`
    (a plain step: a fair sample of what a draft token costs; or a catch-up).
    `agreement`: the caller's with the cache (logits_for_suffix)."""
    began, decoded = time.perf_counter(), backend.tokens_decoded
    row = logits_for_suffix(backend, sequence, 1, agreement=agreement)[0]
    _time_step(backend, timings, began, decoded)
    return row


def step_choices(
    backend: Decoder,
    sequence: Sequence[int],
    timings: DrafterTimings,
    agreement: CacheAgreement | None = None,
) -> Choices:
    """As step_logits, but its greedy choice and that choice's probability alone."""
    began, decoded = time.perf_counter(), backend.tokens_decoded
    choices = choices_for_suffix(backend, sequence, 1, agreement=agreement, with_confidence=True)
    _time_step(backend, timings, began, decoded)
    return choices


def _time_step(backend: Decoder, timings: DrafterTimings, began: float, decoded: int) -> None:
    """A step's time since `began`, when the backend had decoded `decoded` tokens: a plain
    step, or a catch-up of the tokens it decoded before its own."""
    seconds = time.perf_counter() - began
    caught_up = backend.tokens_decoded - decoded - 1
    if caught_up == 0:
        timings.steps.append(seconds)
    elif caught_up > 0:
        timings.catch_ups.append((caught_up, seconds))


class DraftBuilder:
    """Collects draft tokens with the distribution and confidence each came from."""

    def __init__(self, source: DraftSource) -> None:
        self.source = source
        self.tokens: list[int] = []
        self.dists: list[Distribution] = []
        self.confidences: list[float] = []

    def add(self, dist: Distribution, sure: float, chooser: TokenChooser, position: int) -> int:
        token = chooser.pick(dist, position)
        self.tokens.append(token)
        self.dists.append(dist)
        self.confidences.append(sure)
        return token

    def build(self) -> Draft:
        return Draft(self.tokens, self.dists, self.source, self.confidences)


class NgramIndex:
    """Prompt-lookup drafting: where did the text's current ending occur before, and what
    followed it there? Kept in step with a growing context, scanned at each lookup.

    Of several earlier occurrences it prefers the first one after the place the last
    continuation came from: an answer that copies its input (an edit, a refactor) moves
    forward through it, and the most recent occurrence is often the wrong one.

    A continuation taken from the prompt stops at the prompt's end (`answer_start`): what
    follows there is the answer's own beginning, not what follows the matched text (on a
    long edit, the end of the copied file drafted the chat template and the answer's first
    line: 30 tokens verified for 2)."""

    def __init__(self, max_n: int = 16, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.answer_start = 0  # 0: no boundary
        self._reset()

    def _reset(self) -> None:
        self._scan = TokenScan()
        self._cursor = -1  # where the last continuation was taken from
        self._context: Sequence[int] | None = None  # the list last synced with

    def sync(self, context: Sequence[int]) -> None:
        known = len(self._scan.tokens)
        # the engine's growing list is not compared again (32k tokens took 260 µs a round)
        grown = only_grown(context, self._context, known)
        if not grown and (len(context) < known or list(context[:known]) != self._scan.tokens):
            self._reset()  # the history was edited (a new chat, a trimmed turn): start over
            known = 0
        self._scan.extend(context[known:])
        self._context = context

    def lookup(self, max_tokens: int) -> NgramMatch:
        """The tokens that followed the longest earlier match of the text's ending. Only
        looks: planning a draft that is then not proposed must not change later lookups."""
        tokens = self._scan.tokens
        if not tokens:
            return NO_MATCH
        ends, lengths = self._scan.match_lengths(tokens, self.max_n, before=len(tokens) - 1)
        kept = ends != self.answer_start - 1
        ends, lengths = ends[kept], lengths[kept]
        n = int(lengths.max()) if ends.size else 0
        if n < max(self.min_n, 1):
            return NO_MATCH
        end = first_after(ends[lengths >= n].tolist(), self._cursor)
        return NgramMatch(self._continuation(end, max_tokens), n, end)

    def _continuation(self, end: int, max_tokens: int) -> tuple[int, ...]:
        if end < self.answer_start:
            max_tokens = min(max_tokens, self.answer_start - end - 1)
        return self._scan.following(end, max_tokens)

    def take(self, match: NgramMatch) -> None:
        """`match` is being proposed: later lookups prefer occurrences after it."""
        if match.tokens:
            self._cursor = match.end


def first_after(ends: Sequence[int], cursor: int) -> int:
    """Of the sorted places a match ends, the first after the one last drafted from (a copy
    moves forward through its source), else the latest."""
    following = bisect.bisect_right(ends, cursor)
    return ends[following] if following < len(ends) else ends[-1]


@dataclass(frozen=True)
class NgramMatch:
    tokens: tuple[int, ...]  # what followed the earlier occurrence
    length: int  # n: how many tokens of the text's ending matched (0: no match)
    end: int  # where the earlier occurrence ended


NO_MATCH = NgramMatch((), 0, -1)


@dataclass
class NgramDrafter:
    """Proposes the continuation of the longest earlier match, as a certain (point-mass)
    draft: the exact rule then keeps it with probability p(x) under the target."""

    index: NgramIndex = field(default_factory=NgramIndex)

    def candidates(self, context: Sequence[int], max_tokens: int) -> NgramMatch:
        self.index.sync(context)
        return self.index.lookup(max_tokens)

    def take(self, match: NgramMatch, n_tokens: int) -> Draft:
        """The draft of the first `n_tokens` of `match`, proposed."""
        self.index.take(match)
        return ngram_draft(match.tokens[:n_tokens], match.length)

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        return self.take(self.candidates(context, max_tokens), max_tokens)

    def observe(self, outcome: Outcome) -> None:
        pass

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.index.answer_start = prompt_length


def ngram_draft(
    tokens: Sequence[int], match_length: int, source: DraftSource = DraftSource.NGRAM
) -> Draft:
    dists = [Distribution.point(token) for token in tokens]
    return Draft(list(tokens), dists, source, match_length=match_length)


class PredictionIndex:
    """Where the answer so far stands in a prediction (Predicted Outputs: the file being
    edited, the document being reformatted), and what the prediction says comes next.

    The answer's ending is looked up in the prediction, longest match first; of several
    places it prefers the first after the one last drafted from, so drafts follow the
    prediction in order and pick it up again after a changed, inserted or deleted span."""

    MAX_N = 12

    def __init__(self, prediction: Sequence[int]) -> None:
        self._scan = TokenScan()
        self._scan.extend(prediction)
        self._cursor = -1

    @property
    def tokens(self) -> list[int]:
        return self._scan.tokens

    def lookup(self, answer: Sequence[int], max_tokens: int) -> NgramMatch:
        """What the prediction says follows the answer so far. Only looks."""
        if not answer:
            return NO_MATCH
        ends, lengths = self._scan.match_lengths(answer, self.MAX_N, before=len(self.tokens))
        for n in range(int(lengths.max()) if ends.size else 0, 0, -1):
            end = first_after(ends[lengths >= n].tolist(), self._cursor)
            following = self._scan.following(end, max_tokens)
            if following:
                return NgramMatch(following, n, end)
        return NO_MATCH

    def take(self, match: NgramMatch, n_tokens: int) -> Draft:
        """The draft of the first `n_tokens` of `match`, proposed."""
        self._cursor = match.end
        return ngram_draft(match.tokens[:n_tokens], match.length, source=DraftSource.PREDICTION)
