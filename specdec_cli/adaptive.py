"""Choosing, each round, whether and how far to draft, from measured costs and acceptance.

On a CPU a drafter step costs a sizeable fraction of a target step, and verifying k tokens
costs more than verifying one, so a fixed draft length loses on text the drafter cannot
predict. Each round this module compares the expected tokens per second of
  - the target alone (one token per decode),
  - an n-gram draft (free to propose; the continuation of an earlier match), and
  - a model draft (grown token by token while the next token is still worth its cost),
and picks the best. Costs are timed on this machine at start and refined every round;
acceptance rates are learned as the answer goes. None of this touches the acceptance rule:
every decision depends only on what the drafters know, never on the target's verdict for
the tokens being decided, so the output stays exactly the target's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .backend import Backend
from .drafters import Draft, DraftBuilder, ModelDrafter, NgramDrafter, Outcome, ngram_draft
from .sampling import SamplingSettings

SMOOTHING = 0.1  # weight of the newest cost sample in the running averages


@dataclass
class CostModel:
    """Seconds for a target decode of n tokens (base + per_token * (n - 1)) and for one
    drafter step."""

    target_base: float
    target_per_token: float
    draft_step: float
    learn: bool = True  # refine from each round's timings

    def verify(self, n_tokens: int) -> float:
        return self.target_base + self.target_per_token * (n_tokens - 1)

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        if not self.learn:
            return
        if n_tokens == 1:
            self.target_base += SMOOTHING * (seconds - self.target_base)
        else:
            per_token = max(0.0, (seconds - self.target_base) / (n_tokens - 1))
            self.target_per_token += SMOOTHING * (per_token - self.target_per_token)

    def observe_draft_step(self, seconds: float) -> None:
        if self.learn:
                self.draft_step += SMOOTHING * (seconds - self.draft_step)

    def as_dict(self) -> dict:
        return {
            "target_one_token_ms": round(1000 * self.target_base, 2),
            "target_per_extra_token_ms": round(1000 * self.target_per_token, 2),
            "draft_step_ms": round(1000 * self.draft_step, 2),
        }


def measure_costs(
    target: Backend, drafter: Backend | None, probe: Sequence[int], batch: int = 5
) -> CostModel:
    """Time the decodes that matter on this machine, on a throwaway probe text."""
    base = _median_decode_seconds(target, probe, 1)
    batched = _median_decode_seconds(target, probe, batch)
    step = _median_decode_seconds(drafter, probe, 1) if drafter is not None else 0.0
    return CostModel(base, max(0.0, (batched - base) / (batch - 1)), step)


def _median_decode_seconds(backend: Backend, probe: Sequence[int], n: int, reps: int = 3) -> float:
    context, tail = list(probe[:-n]), list(probe[-n:])
    backend.truncate(0)
    backend.decode(context, 1)
    samples = []
    for _ in range(reps):
        backend.truncate(len(context))
        began = time.perf_counter()
        backend.decode(tail, n)
        samples.append(time.perf_counter() - began)
    backend.truncate(0)
    return float(np.median(samples))


@dataclass
class Rate:
    """A success rate learned online, starting from a prior worth `weight` observations and
    forgetting slowly, so it follows the text as it changes."""

    prior: float
    weight: float = 4.0
    decay: float = 0.97
    hits: float = field(init=False)
    total: float = field(init=False)

    def __post_init__(self) -> None:
        self.hits, self.total = self.prior * self.weight, self.weight

    @property
    def value(self) -> float:
        return self.hits / self.total

    def update(self, hit: bool) -> None:
        self.hits = self.hits * self.decay + float(hit)
        self.total = self.total * self.decay + 1.0


CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)


@dataclass
class AcceptanceModel:
    """How likely the target is to keep a draft token.

    Model drafts: by the drafter's confidence (calibrated per confidence bucket).
    N-gram drafts: the first token by match length; each later one given the one before.
    """

    by_confidence: list[Rate] = field(
        default_factory=lambda: [Rate(p) for p in (0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97)]
    )
    ngram_first: dict[int, Rate] = field(default_factory=dict)
    ngram_next: Rate = field(default_factory=lambda: Rate(0.8))
    model_first: Rate = field(default_factory=lambda: Rate(0.6))

    def for_confidence(self, confidence: float) -> Rate:
        return self.by_confidence[int(np.searchsorted(CONFIDENCE_EDGES, confidence, "right"))]

    def for_ngram(self, match_length: int) -> Rate:
        if match_length not in self.ngram_first:
            self.ngram_first[match_length] = Rate(min(0.7, 0.2 + 0.15 * match_length))
        return self.ngram_first[match_length]

    def learn(self, draft: Draft, n_accepted: int) -> None:
        checked = min(len(draft.tokens), n_accepted + 1)  # tokens after a rejection are unseen
        for i in range(checked):
            hit = i < n_accepted
            if draft.source == "model":
                self.for_confidence(draft.confidences[i]).update(hit)
                if i == 0:
                    self.model_first.update(hit)
            elif draft.source == "ngram":
                (self.for_ngram(draft.match_length) if i == 0 else self.ngram_next).update(hit)


def expected_tokens(first: float, following: float, k: int) -> float:
    """Tokens a round emits when drafting k: the target's own token plus each draft token
    that survives (the i-th survives with probability first * following^(i-1))."""
    if k <= 0:
        return 1.0
    return 1.0 + first * sum(following**i for i in range(k))


@dataclass
class AdaptiveDrafter:
    """Per round: n-gram draft, model draft, or none, whichever promises the most tokens per
    second; a model draft grows only while its next token pays for itself."""

    costs: CostModel
    model: ModelDrafter | None = None
    ngram: NgramDrafter | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    probe_every: int = 8  # rounds between model drafts tried while they do not pay
    margin: float = 1.02  # a plan must beat the target alone by this much
    _rounds_without_model: int = 0
    _rounds_without_ngram: int = 0

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
    ) -> Draft:
        plain_rate = 1.0 / self.costs.verify(1)
        ngram_tokens, ngram_rate = self._ngram_plan(context, max_tokens)
        model_rate = self._model_rate(max_tokens)
        if ngram_tokens and (
            ngram_rate >= max(model_rate, plain_rate * self.margin)
            or self._rounds_without_ngram >= self.probe_every
        ):
            self._rounds_without_ngram = 0
            return ngram_draft(ngram_tokens, self._last_match_length)
        if ngram_tokens:
            self._rounds_without_ngram += 1
        if self.model is not None and (
            model_rate > plain_rate * self.margin or self._rounds_without_model >= self.probe_every
        ):
            self._rounds_without_model = 0
            return self._model_draft(context, max_tokens, sampling, rng)
        self._rounds_without_model += 1
        return Draft.empty()

    def observe(self, outcome: Outcome) -> None:
        draft = outcome.draft
        self.acceptance.learn(draft, outcome.n_accepted)
        if not outcome.includes_prompt:
            self.costs.observe_verify(len(draft.tokens) + 1, outcome.verify_seconds)
        if self.model is not None:
            for seconds in self.model.step_seconds:
                self.costs.observe_draft_step(seconds)
            self.model.step_seconds.clear()

    # -- planning --------------------------------------------------------------------------

    def _best_length(self, first: float, following: float, max_tokens: int, step: float):
        """The draft length with the most expected tokens per second, and that rate."""
        best_k, best_rate = 0, 1.0 / self.costs.verify(1)
        for k in range(1, max_tokens + 1):
            seconds = k * step + self.costs.verify(k + 1)
            rate = expected_tokens(first, following, k) / seconds
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _ngram_plan(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], float]:
        self._last_match_length = 0
        if self.ngram is None:
            return [], 0.0
        tokens, n = self.ngram.candidates(context, max_tokens)
        if not tokens:
            return [], 0.0
        self._last_match_length = n
        first = self.acceptance.for_ngram(n).value
        k, rate = self._best_length(first, self.acceptance.ngram_next.value, len(tokens), 0.0)
        # A match that does not pay now is still tried now and then (one token), to relearn.
        return tokens[: max(k, 1)], rate if k else 0.0

    def _model_rate(self, max_tokens: int) -> float:
        if self.model is None:
            return 0.0
        first = self.acceptance.model_first.value
        following = self.acceptance.by_confidence[-2].value
        return self._best_length(first, following, max_tokens, self.costs.draft_step)[1]

    def _model_draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
    ) -> Draft:
        draft = DraftBuilder("model")
        sequence = list(context)
        survive, expected = 1.0, 1.0  # P(all drafted so far kept); expected tokens emitted
        for k in range(max_tokens):
            dist, sure = self.model.next_distribution(sequence, sampling)
            keep = survive * self.acceptance.for_confidence(sure).value
            spent = (k + 1) * self.costs.draft_step
            # Keep this token only if it raises the round's expected tokens per second.
            if (expected + keep) / (spent + self.costs.verify(k + 2)) <= expected / (
                spent + self.costs.verify(k + 1)
            ):
                break
            token = draft.add(dist, sure, sampling, rng)
            survive, expected = keep, expected + keep
            sequence.append(token)
            if self.model.backend.is_end_of_generation(token):
                break
        return draft.build()


DRAFTER_MODES = ("combined", "model", "ngram", "fixed")
NEEDS_DRAFT_MODEL = ("combined", "model", "fixed")
_PROBE_TEXT = (
    "def mean(values):\n    return sum(values) / len(values)\n\n"
    "The quick brown fox jumps over the lazy dog."
)


def build_drafter(
    mode: str, target: Backend, draft_model: Backend | None, costs: CostModel | None = None
):
    """The drafter for a --drafter mode:
    fixed     the draft model, always --draft-max tokens (the classic loop);
    model     the draft model, lengths chosen each round from costs and confidence;
    ngram     prompt lookup only: no draft model needed;
    combined  an n-gram match when one promises more, else the draft model, else neither."""
    if mode not in DRAFTER_MODES:
        raise ValueError(f"unknown drafter mode {mode!r}")
    if mode == "fixed":
        return ModelDrafter(draft_model)
    model = ModelDrafter(draft_model) if draft_model is not None and mode != "ngram" else None
    costs = costs or measure_pair_costs(target, model.backend if model else None)
    ngram = NgramDrafter() if mode in ("combined", "ngram") else None
    return AdaptiveDrafter(costs, model=model, ngram=ngram)


def measure_pair_costs(target: Backend, draft_model: Backend | None) -> CostModel:
    probe = target.tokenize(_PROBE_TEXT, add_special=True)
    return measure_costs(target, draft_model, probe)
