"""Speculative and plain generation over Decoders. Yields events; knows nothing of terminals."""

from __future__ import annotations

import codecs
import os
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

import numpy as np

from ..structured import Structure
from .backend import ArgmaxRows, CacheAgreement, Decoder, choices_for_suffix, logits_for_suffix
from .constraint import ConstrainedDistributions, allowed_prefix
from .drafters import Draft, Drafter, DraftSource, ForcedPlanner, Outcome, ngram_draft
from .logprobs import TokenLogprob, token_logprob
from .penalties import Penalties, biased
from .sampling import (
    Distribution,
    GumbelChooser,
    RandomChooser,
    SamplingSettings,
    TokenChooser,
    distribution,
)
from .verification import (
    AcceptanceRule,
    SamplingRule,
    Verdict,
    greedy_accept,
    invariant_accept,
    speculative_accept,
)

Rows = TypeVar("Rows")  # a decode's logit rows, or only their greedy choices


class TokenKind(str, Enum):
    TARGET = "target"  # the target decoded it alone (no draft that round)
    ACCEPTED = "accepted"  # drafted, and the target agreed
    CORRECTION = "correction"  # the target's token in place of a rejected draft
    BONUS = "bonus"  # the target's extra token after a fully accepted draft


class FinishReason(str, Enum):
    STOP = "stop"  # the model ended its answer
    STOP_STRING = "stop_string"  # the text reached one of the stop strings
    LENGTH = "length"  # max_tokens
    CONTEXT = "context"  # the context window is full
    INTERRUPTED = "interrupted"  # the consumer stopped early (Ctrl-C)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GenerationSettings:
    max_tokens: int = 256
    draft_max: int = 8
    stop: tuple[str, ...] = ()
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int | None = None
    rule: SamplingRule = SamplingRule.INVARIANT
    prediction: tuple[int, ...] = ()  # Predicted Outputs: token ids of the expected answer
    structure: Structure | None = None  # what the answer must be (a grammar, a JSON schema)
    # each emitted token's log-probability and this many alternatives' (logprobs.py); None:
    # none, and a greedy answer may leave its rows on the target's device
    logprobs: int | None = None
    penalties: Penalties = field(default_factory=Penalties)  # by the answer's own tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, amount added to its logit)


@dataclass(frozen=True)
class Piece:
    """Text released by one emitted token (may be empty while a character or stop string is
    incomplete). `token` is None for the text flushed when generation ends; `logprob` is
    the token's where the settings ask for them (not for the end-of-generation token)."""

    token: int | None
    kind: TokenKind
    text: str
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class Round:
    """One draft-and-verify round (or one plain target step when nothing was drafted)."""

    drafted: int
    accepted: int
    source: DraftSource
    draft_seconds: float
    verify_seconds: float


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0
    seconds: float = 0.0
    first_token_seconds: float | None = None
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_lengths: Counter = field(default_factory=Counter)
    draft_sources: Counter = field(default_factory=Counter)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # The end-of-generation token that ended an answer: a pass chose it, the text omits it.
    end_tokens: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens the target decided per pass, the end-of-generation token included: the
        target alone makes exactly 1.0, whether its answer ends at EOS or at --max-tokens."""
        decided = self.generated + self.end_tokens
        return decided / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    def add_round(self, r: Round) -> None:
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.target_passes += 1
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds
        self.draft_lengths[r.drafted] += 1
        self.draft_sources[r.source] += 1
        if r.source == DraftSource.PREDICTION:  # OpenAI's counts: predicted tokens kept or not
            self.accepted_prediction_tokens += r.accepted
            self.rejected_prediction_tokens += r.drafted - r.accepted

    def merge(self, other: GenerationStats) -> None:
        """Add another generation's counts and times to these. `prompt_tokens` and
        `first_token_seconds` describe a single generation and stay as they are."""
        self.generated += other.generated
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.target_passes += other.target_passes
        self.seconds += other.seconds
        self.draft_seconds += other.draft_seconds
        self.verify_seconds += other.verify_seconds
        self.draft_lengths.update(other.draft_lengths)
        self.draft_sources.update(other.draft_sources)
        self.accepted_prediction_tokens += other.accepted_prediction_tokens
        self.rejected_prediction_tokens += other.rejected_prediction_tokens
        self.end_tokens += other.end_tokens

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "target_passes": self.target_passes,
            "tokens_per_pass": round(self.tokens_per_pass, 4),
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "first_token_seconds": (
                None if self.first_token_seconds is None else round(self.first_token_seconds, 4)
            ),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "draft_lengths": {str(k): v for k, v in sorted(self.draft_lengths.items())},
            "draft_sources": dict(self.draft_sources),
            "accepted_prediction_tokens": self.accepted_prediction_tokens,
            "rejected_prediction_tokens": self.rejected_prediction_tokens,
        }


@dataclass(frozen=True)
class Finished:
    text: str
    tokens: list[int]
    finish_reason: FinishReason
    stats: GenerationStats


Event = Piece | Round | Finished


class _TextAssembler:
    """Bytes of tokens -> UTF-8 text, holding back what might be the start of a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.released = ""

    def feed(self, data: bytes) -> tuple[str, bool]:
        """Returns (text now safe to show, whether a stop string was reached)."""
        self._pending += self._decoder.decode(data)
        hits = [at for at in (self._pending.find(s) for s in self._stops) if at >= 0]
        if hits:  # cut at the earliest stop, whichever of them it is
            return self._release(self._pending[: min(hits)]), True
        hold = max((partial_match(self._pending, s) for s in self._stops), default=0)
        return self._release(self._pending[: len(self._pending) - hold]), False

    def flush(self) -> str:
        return self._release(self._pending + self._decoder.decode(b"", final=True))

    def _release(self, text: str) -> str:
        self._pending = self._pending[len(text) :] if self._pending.startswith(text) else ""
        self.released += text
        return text


def partial_match(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def _text_of(target: Decoder, tokens: Sequence[int]) -> str:
    return b"".join(target.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def _chooser(rule: SamplingRule, seed: int, rng: np.random.Generator) -> TokenChooser:
    return GumbelChooser(seed) if rule == SamplingRule.INVARIANT else RandomChooser(rng)


class _LazyDistributions(Sequence):
    """Target distributions per verified row, computed only for rows the rule reaches."""

    def __init__(self, rows: np.ndarray, sampling: SamplingSettings) -> None:
        self._rows, self._sampling = rows, sampling
        self._cache: dict[int, Distribution] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if i not in self._cache:
            self._cache[i] = distribution(self._rows[i], self._sampling)
        return self._cache[i]


class Generation:
    """One answer. Iterate `events()`; `tokens`, `text` and `stats` stay readable if the
    consumer stops early (Ctrl-C)."""

    def __init__(
        self,
        target: Decoder,
        prompt: Sequence[int],
        settings: GenerationSettings,
        drafter: Drafter | None = None,
        acceptance: AcceptanceRule = speculative_accept,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.settings = settings
        self.acceptance = acceptance
        self.prompt = list(prompt)
        self.tokens: list[int] = []
        self._counts: Counter[int] = Counter()  # of `tokens`, where penalties count them
        # prompt + tokens, kept in step rather than joined each round: a join copies the
        # whole context (250 µs at 32k tokens, twice a round), 5% of a 7B step on a GPU
        self._context = list(self.prompt)
        self._target_cache = CacheAgreement()  # how much of _context the target's cache holds
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))
        self.seed = settings.seed if settings.seed is not None else _fresh_seed()
        self._rng = np.random.default_rng(self.seed)
        self._chooser = _chooser(settings.rule, self.seed, self._rng)
        self._text = _TextAssembler(settings.stop)
        self._n_ctx = target.n_ctx
        self._started: float | None = None
        structure = settings.structure
        self._constraint = target.constrain(structure) if structure is not None else None
        # Forced drafts lay out what the grammar leaves free as the prompt and answer do.
        self._prompt_text = _text_of(target, self.prompt) if self._constraint is not None else ""
        if drafter is not None:
            drafter.begin(len(self.prompt), settings.prediction)

    @property
    def text(self) -> str:
        return self._text.released

    def interrupted(self) -> Finished:
        """What was produced before the consumer stopped iterating (Ctrl-C)."""
        if self._started is not None:
            self.stats.seconds = time.perf_counter() - self._started
        return Finished(self.text, list(self.tokens), FinishReason.INTERRUPTED, self.stats)

    def run(self, on_piece: Callable[[Piece], None] | None = None) -> Finished:
        """Generate to the end, handing each piece of text to `on_piece`."""
        for event in self.events():
            if isinstance(event, Piece) and on_piece is not None:
                on_piece(event)
            elif isinstance(event, Finished):
                return event
        raise AssertionError("events() always ends with Finished")

    def events(self) -> Generator[Event, None, None]:
        start = self._started = time.perf_counter()
        finish_reason: FinishReason | None = None
        while finish_reason is None:
            room = min(
                self.settings.max_tokens - len(self.tokens),
                self._n_ctx - len(self.prompt) - len(self.tokens),
            )
            if room <= 0:
                finish_reason = (
                    FinishReason.LENGTH
                    if len(self.tokens) >= self.settings.max_tokens
                    else FinishReason.CONTEXT
                )
                break
            draft, draft_seconds = self._draft(room - 1)
            first_round = self.stats.target_passes == 0
            verdict, verify_seconds, rows = self._verify(draft)
            accepted = draft.tokens[: verdict.n_accepted]
            logprobs = self._logprobs(rows, [*accepted, verdict.next_token])
            if self.drafter is not None:
                self.drafter.observe(
                    Outcome(draft, verdict.n_accepted, verify_seconds, first_round, draft_seconds)
                )
            round_ = Round(
                len(draft.tokens), len(accepted), draft.source, draft_seconds, verify_seconds
            )
            self.stats.add_round(round_)
            yield round_
            labelled = self._label(draft, accepted, verdict.next_token)
            for (token, kind), logprob in zip(labelled, logprobs, strict=True):
                piece, finish_reason = self._emit(token, kind, start, logprob)
                yield piece
                if finish_reason:
                    break
        tail = self._text.flush() if finish_reason != FinishReason.STOP_STRING else ""
        if tail:
            yield Piece(None, TokenKind.TARGET, tail)
        self.stats.seconds = time.perf_counter() - start
        yield Finished(self.text, list(self.tokens), finish_reason, self.stats)

    def _draft(self, max_len: int) -> tuple[Draft, float]:
        k = min(self.settings.draft_max, max_len)
        # The first round decodes the prompt alone, as the target alone does (a prompt
        # decoded in one batch with drafts could be computed with other kernels), unless the
        # target computes a prompt the same with rows after it: then forced text rides along,
        # free (a tool call's opening tag and name key in the prompt's pass).
        first = self.stats.target_passes == 0
        if self.drafter is None or k <= 0 or (first and not self.target.prompt_with_drafts):
            return Draft.empty(), 0.0
        began = time.perf_counter()
        forced = (
            self._constraint.forced_tokens(self._prompt_text + self.text, self.tokens)[:k]
            if self._constraint is not None
            else []
        )
        if first:
            draft = ngram_draft(forced, 0, DraftSource.FORCED)
        elif forced:  # free to propose, and the target can write nothing else (but spacing)
            draft = self._forced_draft(forced, k)
        else:
            draft = self.drafter.propose(self._context, k, self.settings.sampling, self._chooser)
        # A draft may end before its first forbidden token, saving the rows the target would
        # reject it at, where each position's choice is the target's own; under the classic
        # rule a rejected sampled token's replacement comes from the residual p - q instead.
        if self._constraint is not None and self._choices_are_the_targets:
            draft = draft.cut(allowed_prefix(draft.tokens, self._constraint))
        return draft, time.perf_counter() - began

    def _forced_draft(self, forced: list[int], k: int) -> Draft:
        """The forced text as far as the planner takes it; where it takes all of it, what
        the drafter proposes after it, in the same round (a schema's key, then its value:
        one pass instead of two)."""
        if not isinstance(self.drafter, ForcedPlanner):
            return ngram_draft(forced, 0, DraftSource.FORCED)
        draft = self.drafter.plan_forced(forced, self.target.is_end_of_generation(forced[-1]))
        room = k - len(draft.tokens)
        if not draft.tokens or len(draft.tokens) < len(forced) or room <= 0:
            return draft
        assert self.drafter is not None
        context = self._context + draft.tokens
        after = self.drafter.propose(context, room, self.settings.sampling, self._chooser)
        return draft.then(after)

    @property
    def _choices_are_the_targets(self) -> bool:
        """Greedy or the invariant rule: each position's token is the target's own choice."""
        return self.settings.sampling.greedy or self.settings.rule == SamplingRule.INVARIANT

    def _verify(self, draft: Draft) -> tuple[Verdict, float, np.ndarray | None]:
        """The verdict, the time it took and the target's logit rows (None where only their
        choices came back)."""
        began = time.perf_counter()
        greedy = self.settings.sampling.greedy and self._constraint is None
        if greedy and self._choices_are_the_logits_argmax:
            # Only each row's argmax is read: where the target takes it on its device, the
            # rows never come to the host.
            verdict = greedy_accept(draft.tokens, self._target_rows(draft, choices_for_suffix))
            return verdict, time.perf_counter() - began, None
        rows = self._target_rows(draft, logits_for_suffix)
        scored = self._adjusted(rows, draft.tokens)
        if greedy:
            verdict = greedy_accept(draft.tokens, ArgmaxRows(scored))
        else:
            verdict = self._sampled_verdict(draft, scored)
        return verdict, time.perf_counter() - began, rows

    @property
    def _choices_are_the_logits_argmax(self) -> bool:
        """Nothing read of the rows but their argmax: no logprobs, no penalty or bias."""
        settings = self.settings
        return settings.logprobs is None and not settings.penalties and not settings.logit_bias

    def _adjusted(self, rows: np.ndarray, draft: list[int]) -> np.ndarray:
        """The rows the choices are made from: penalised and biased (a copy), or as read."""
        penalties, bias = self.settings.penalties, self.settings.logit_bias
        adjusted = penalties.rows(rows, self._counts, draft) if penalties else rows
        if bias:
            adjusted = biased(adjusted if penalties else rows.copy(), bias)
        return adjusted

    def _logprobs(self, rows: np.ndarray | None, emitted: list[int]) -> list[TokenLogprob | None]:
        """The log-probability of each token a round emits (row i decided its i-th token),
        read before the target's next decode can overwrite the rows."""
        n_top = self.settings.logprobs
        if rows is None or n_top is None:
            return [None] * len(emitted)
        return [token_logprob(rows[i], token, n_top) for i, token in enumerate(emitted)]

    def _target_rows(self, draft: Draft, read: Callable[..., Rows]) -> Rows:
        """One batched decode: the last accepted token plus every draft token, a row each,
        as `read` (logits_for_suffix, choices_for_suffix) returns them. The draft joins the
        context for the decode alone."""
        answered = len(self._context)
        self._context += draft.tokens
        try:
            return read(
                self.target,
                self._context,
                len(draft.tokens) + 1,
                prompt=self.stats.target_passes == 0,
                agreement=self._target_cache,
            )
        finally:
            del self._context[answered:]
            self._target_cache.changed_from(answered)

    def _sampled_verdict(self, draft: Draft, rows: np.ndarray) -> Verdict:
        """The verdict from the target's logit rows: masked by the constraint, or by the
        sampling rule."""
        sampling = self.settings.sampling
        if self._constraint is not None:
            verdict = self._constrained_verdict(draft, rows)
        elif self.settings.rule == SamplingRule.INVARIANT:
            position = len(self.prompt) + len(self.tokens)
            targets = _LazyDistributions(rows, sampling)
            verdict = invariant_accept(draft.tokens, targets, self._chooser, position)
        else:
            targets = _LazyDistributions(rows, sampling)
            verdict = self.acceptance(draft.tokens, draft.dists, targets, self._rng)
        return verdict

    def _constrained_verdict(self, draft: Draft, rows: np.ndarray) -> Verdict:
        """The verdict with every row masked by the constraint, which moves on, as the rows
        are masked, by the tokens kept, and then by the target's own."""
        assert self._constraint is not None
        targets = ConstrainedDistributions(
            rows, self.settings.sampling, self._constraint, draft.tokens
        )
        if self._choices_are_the_targets:
            position = len(self.prompt) + len(self.tokens)
            verdict = invariant_accept(draft.tokens, targets, self._chooser, position)
        else:
            verdict = self.acceptance(draft.tokens, draft.dists, targets, self._rng)
        kept = draft.tokens[: verdict.n_accepted]
        targets.accept_kept(verdict.n_accepted)
        if not any(map(self.target.is_end_of_generation, [*kept, verdict.next_token])):
            self._constraint.accept(verdict.next_token)  # after an end, nothing is emitted
        return verdict

    @staticmethod
    def _label(draft: Draft, accepted: list[int], next_token: int):
        for token in accepted:
            yield token, TokenKind.ACCEPTED
        if not draft.tokens:
            yield next_token, TokenKind.TARGET
        elif len(accepted) < len(draft.tokens):
            yield next_token, TokenKind.CORRECTION
        else:
            yield next_token, TokenKind.BONUS

    def _emit(
        self, token: int, kind: TokenKind, start: float, logprob: TokenLogprob | None
    ) -> tuple[Piece, FinishReason | None]:
        if self.stats.first_token_seconds is None:
            self.stats.first_token_seconds = time.perf_counter() - start
        if self.target.is_end_of_generation(token):
            self.stats.end_tokens += 1
            return Piece(token, kind, ""), FinishReason.STOP
        self.tokens.append(token)
        self._context.append(token)
        if self.settings.penalties:
            self._counts[token] += 1
        self.stats.generated = len(self.tokens)
        text, hit_stop = self._text.feed(self.target.token_bytes(token))
        return Piece(token, kind, text, logprob), FinishReason.STOP_STRING if hit_stop else None
