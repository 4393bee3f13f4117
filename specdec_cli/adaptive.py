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
from .drafters import (
    NO_MATCH,
    Draft,
    DraftBuilder,
    Drafter,
    ModelDrafter,
    NgramDrafter,
    NgramMatch,
    Outcome,
    PredictionIndex,
)
from .sampling import SamplingSettings, TokenChooser

SMOOTHING = 0.1  # weight of the newest cost sample in the running averages


@dataclass
class CostModel:
    """Seconds for one target decode of n tokens, and for one drafter step.

    The target's cost is a table over n, interpolated: on CPUs it is far from linear (here
    8 tokens cost 6x one token, 16 tokens barely more than 8, as llama.cpp switches
    kernels), so a straight line would pick the wrong draft lengths."""

    verify_seconds: dict[int, float]
    draft_step: float
    learn: bool = True  # refine from each round's timings
    # What a round costs beyond the decode measured at start (Python, a busier machine),
    # learned from every round. One shift for all sizes: most rounds verify one token, and
    # learning the one-token cost alone would make longer drafts look cheaper than they are.
    overhead: float = 0.0
    _dense: np.ndarray | None = field(default=None, init=False, repr=False)

    def verify(self, n_tokens: int) -> float:
        if self._dense is None or n_tokens > len(self._dense):
            self._dense = self._interpolate(max(n_tokens, 64))
        return max(1e-6, float(self._dense[n_tokens - 1]) + self.overhead)

    def _interpolate(self, up_to: int) -> np.ndarray:
        sizes = sorted(self.verify_seconds)
        seconds = [self.verify_seconds[n] for n in sizes]
        wanted = np.arange(1, up_to + 1)
        dense = np.interp(wanted, sizes, seconds)
        if len(sizes) > 1:  # beyond the last measurement, continue its slope
            slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
            beyond = wanted > sizes[-1]
            dense[beyond] = seconds[-1] + slope * (wanted[beyond] - sizes[-1])
        return dense

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        if self.learn:
            self.overhead += SMOOTHING * (seconds - self.verify(n_tokens))

    def observe_draft_step(self, seconds: float) -> None:
        if self.learn:
            self.draft_step += SMOOTHING * (seconds - self.draft_step)

    def as_dict(self) -> dict:
        return {
            "target_decode_ms": {
                str(n): round(1000 * s, 2) for n, s in sorted(self.verify_seconds.items())
            },
            "draft_step_ms": round(1000 * self.draft_step, 2),
            "overhead_ms": round(1000 * self.overhead, 2),
        }


MEASURED_SIZES = (1, 2, 4, 8, 16, 32)


def measure_costs(target: Backend, drafter: Backend | None, probe: Sequence[int]) -> CostModel:
    """Time the decodes that matter on this machine, on a throwaway probe text."""
    context = list(probe[: len(probe) - max(MEASURED_SIZES)])
    room = min(target.n_ctx, len(probe)) - len(context)
    table = {
        n: _median_decode_seconds(target, context, probe[len(context) : len(context) + n])
        for n in MEASURED_SIZES
        if n <= room
    }
    step = _median_decode_seconds(drafter, context, probe[len(context) :][:1]) if drafter else 0.0
    for backend in (target, drafter):
        if backend is not None:
            backend.truncate(0)
    return CostModel(table, step)


def _median_decode_seconds(
    backend: Backend, context: Sequence[int], tail: Sequence[int], reps: int = 2
) -> float:
    if backend.cached[: len(context)] != list(context):
        backend.truncate(0)
        backend.decode(context, 1)
    samples = []
    for _ in range(reps):
        backend.truncate(len(context))
        began = time.perf_counter()
        backend.decode(tail, len(tail))
        samples.append(time.perf_counter() - began)
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
# How often an n-gram's continuation starts right, by match length 1, 2, 3, 4, 5+: long
# matches are copies in progress. Cautious, since each wrong guess costs a verification:
# edits reach these rates and more, prose and fresh code far less. Learned per answer.
NGRAM_FIRST_PRIORS = (0.2, 0.4, 0.6, 0.7, 0.75)
# The same for drafts from a prediction: text the user expects the answer to repeat, so
# trusted more from the start; learned per answer like the others.
PREDICTION_FIRST_PRIORS = (0.5, 0.65, 0.75, 0.85, 0.9)


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
    ngram_next: Rate = field(default_factory=lambda: Rate(0.85))
    model_first: Rate = field(default_factory=lambda: Rate(0.6))
    prediction_first: dict[int, Rate] = field(default_factory=dict)
    prediction_next: Rate = field(default_factory=lambda: Rate(0.95))

    def for_confidence(self, confidence: float) -> Rate:
        return self.by_confidence[int(np.searchsorted(CONFIDENCE_EDGES, confidence, "right"))]

    def for_prediction(self, match_length: int) -> Rate:
        bucket = min(match_length, len(PREDICTION_FIRST_PRIORS))
        if bucket not in self.prediction_first:
            self.prediction_first[bucket] = Rate(PREDICTION_FIRST_PRIORS[bucket - 1])
        return self.prediction_first[bucket]

    def for_ngram(self, match_length: int) -> Rate:
        bucket = min(match_length, len(NGRAM_FIRST_PRIORS))
        if bucket not in self.ngram_first:
            self.ngram_first[bucket] = Rate(NGRAM_FIRST_PRIORS[bucket - 1])
        return self.ngram_first[bucket]

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
            elif draft.source == "prediction":
                first = self.for_prediction(draft.match_length)
                (first if i == 0 else self.prediction_next).update(hit)


def expected_tokens(first: float, following: float, k: int) -> float:
    """Tokens a round emits when drafting k: the target's own token plus each draft token
    that survives (the i-th survives with probability first * following^(i-1))."""
    if k <= 0:
        return 1.0
    return 1.0 + first * sum(following**i for i in range(k))


@dataclass
class ProbeSchedule:
    """A kind of draft that does not pay is still tried now and then, to notice when the
    text becomes predictable; each fruitless try doubles the wait."""

    first: int = 32
    longest: int = 512
    interval: int = field(init=False)
    waited: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.interval = self.first

    def due(self) -> bool:
        return self.waited >= self.interval

    def skipped(self) -> None:
        self.waited += 1

    def probed(self) -> None:
        self.waited, self.interval = 0, min(2 * self.interval, self.longest)

    def paid(self) -> None:
        self.waited, self.interval = 0, self.first


# An n-gram draft tried while n-gram drafts do not pay: short, since on CPU each extra
# token verified costs about 60% of a target step when it is wrong.
PROBE_TOKENS = 2
MIN_PROBE_MATCH = 3
# A batch of tokens decoded to catch the drafter up costs about this fraction of as many
# single steps (llama.cpp batches them into one decode).
CATCH_UP_COST = 0.4  # shorter matches are mostly chance, in prose and code alike


@dataclass
class AdaptiveDrafter:
    """Per round: n-gram draft, model draft, or none, whichever promises the most tokens per
    second; a model draft grows only while its next token pays for itself."""

    costs: CostModel
    model: ModelDrafter | None = None
    ngram: NgramDrafter | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    margin: float = 1.02  # a plan must beat the target alone by this much
    model_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    ngram_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    prediction: PredictionIndex | None = None  # this answer's Predicted Outputs, if any
    prompt_length: int = 0

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        plain_rate = 1.0 / self.costs.verify(1)
        catch_up = self._catch_up_seconds(context)
        model_rate = self._model_rate(max_tokens, *self._model_acceptance(), catch_up)
        match, k, ngram_rate = self._ngram_plan(context, max_tokens)
        predicted, k_predicted, prediction_rate = self._prediction_plan(context, max_tokens)
        best_other = max(model_rate, ngram_rate, plain_rate * self.margin)
        if self.prediction is not None and k_predicted and prediction_rate >= best_other:
            return self.prediction.take(predicted, k_predicted)
        if self.ngram is not None and match.tokens:
            if k and ngram_rate >= max(model_rate, plain_rate * self.margin):
                self.ngram_probes.paid()
                return self.ngram.take(match, k)
            if match.length >= MIN_PROBE_MATCH and self.ngram_probes.due():
                self.ngram_probes.probed()
                return self.ngram.take(match, PROBE_TOKENS)
            self.ngram_probes.skipped()
        if self.model is None:
            return Draft.empty()
        if model_rate > plain_rate * self.margin:
            self.model_probes.paid()
            return self._model_draft(context, max_tokens, sampling, chooser)
        # A probe only if a model draft could pay at all, were the drafter always right.
        if self._model_rate(max_tokens, 0.95, 0.95, catch_up) > plain_rate and (
            self.model_probes.due()
        ):
            self.model_probes.probed()
            return self._model_draft(context, max_tokens, sampling, chooser, at_least=1)
        self.model_probes.skipped()
        return Draft.empty()

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.prompt_length = prompt_length
        self.prediction = PredictionIndex(prediction) if prediction else None

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

    def _best_length(
        self, first: float, following: float, max_tokens: int, step: float, setup: float = 0.0
    ):
        """The draft length with the most expected tokens per second, and that rate."""
        best_k, best_rate = 0, 1.0 / self.costs.verify(1)
        for k in range(1, max_tokens + 1):
            seconds = setup + k * step + self.costs.verify(k + 1)
            rate = expected_tokens(first, following, k) / seconds
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _prediction_plan(
        self, context: Sequence[int], max_tokens: int
    ) -> tuple[NgramMatch, int, float]:
        """What the prediction says comes next (looked up, not taken), the best length to
        use (0: none) and its rate."""
        if self.prediction is None:
            return NO_MATCH, 0, 0.0
        match = self.prediction.lookup(context[self.prompt_length :], max_tokens)
        if not match.tokens:
            return match, 0, 0.0
        first = self.acceptance.for_prediction(match.length)
        return match, *self._match_plan(match, first, self.acceptance.prediction_next)

    def _ngram_plan(self, context: Sequence[int], max_tokens: int) -> tuple[NgramMatch, int, float]:
        """The match (looked up, not taken), the best length to use (0: none), its rate."""
        if self.ngram is None:
            return NO_MATCH, 0, 0.0
        match = self.ngram.candidates(context, max_tokens)
        if not match.tokens:
            return match, 0, 0.0
        first = self.acceptance.for_ngram(match.length)
        return match, *self._match_plan(match, first, self.acceptance.ngram_next)

    def _match_plan(self, match: NgramMatch, first: Rate, following: Rate) -> tuple[int, float]:
        """A point-mass draft of `match`: free to propose, so only verification costs."""
        return self._best_length(first.value, following.value, len(match.tokens), 0.0)

    def _model_acceptance(self) -> tuple[float, float]:
        return self.acceptance.model_first.value, self.acceptance.by_confidence[-2].value

    def _model_rate(
        self, max_tokens: int, first: float, following: float, catch_up: float
    ) -> float:
        if self.model is None:
            return 0.0
        step = self.costs.draft_step
        return self._best_length(first, following, max_tokens, step, catch_up)[1]

    def _catch_up_seconds(self, context: Sequence[int]) -> float:
        """What bringing the drafter's cache up to the text would cost before it can draft:
        after rounds without model drafts it is behind by every token since."""
        if self.model is None:
            return 0.0
        behind = len(context) - 1 - len(self.model.backend.cached)
        return max(0, behind) * self.costs.draft_step * CATCH_UP_COST

    def _model_draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
        at_least: int = 0,
    ) -> Draft:
        model = self.model
        assert model is not None  # propose() plans model drafts only when there is a model
        draft = DraftBuilder("model")
        sequence = list(context)
        survive, expected = 1.0, 1.0  # P(all drafted so far kept); expected tokens emitted
        for k in range(max_tokens):
            dist, sure = model.next_distribution(sequence, sampling)
            keep = survive * self.acceptance.for_confidence(sure).value
            spent = (k + 1) * self.costs.draft_step
            # Keep this token only if it raises the round's expected tokens per second.
            with_it = (expected + keep) / (spent + self.costs.verify(k + 2))
            if k >= at_least and with_it <= expected / (spent + self.costs.verify(k + 1)):
                break
            token = draft.add(dist, sure, chooser, position=len(sequence))
            survive, expected = keep, expected + keep
            sequence.append(token)
            if model.backend.is_end_of_generation(token):
                break
        return draft.build()


DRAFTER_MODES = ("combined", "model", "ngram", "fixed")
FIXED_DRAFT_LENGTH = 8
# Adaptive modes choose each round's length themselves; this only bounds it. Long n-gram
# drafts are what pay on CPU: one decode of 32 tokens costs about 12 single-token decodes.
ADAPTIVE_DRAFT_LIMIT = 32


def default_draft_max(mode: str) -> int:
    return FIXED_DRAFT_LENGTH if mode in ("fixed", "none") else ADAPTIVE_DRAFT_LIMIT


NEEDS_DRAFT_MODEL = ("combined", "model", "fixed")
_PROBE_TEXT = (
    "def mean(values):\n    return sum(values) / len(values)\n\n"
    "def variance(values):\n    m = mean(values)\n"
    "    return sum((v - m) ** 2 for v in values) / len(values)\n\n"
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
    "with a single step, and every long answer begins with a single token."
)


def build_drafter(
    mode: str, target: Backend, draft_model: Backend | None, costs: CostModel | None = None
) -> Drafter:
    """The drafter for a --drafter mode:
    fixed     the draft model, always --draft-max tokens (the classic loop);
    model     the draft model, lengths chosen each round from costs and confidence;
    ngram     prompt lookup only: no draft model needed;
    combined  an n-gram match when one promises more, else the draft model, else neither."""
    if mode not in DRAFTER_MODES:
        raise ValueError(f"unknown drafter mode {mode!r}")
    if mode == "fixed":
        if draft_model is None:
            raise ValueError("the fixed mode drafts with a draft model; none was given")
        return ModelDrafter(draft_model)
    model = ModelDrafter(draft_model) if draft_model is not None and mode != "ngram" else None
    costs = costs or measure_pair_costs(target, model.backend if model else None)
    ngram = NgramDrafter() if mode in ("combined", "ngram") else None
    return AdaptiveDrafter(costs, model=model, ngram=ngram)


def measure_pair_costs(target: Backend, draft_model: Backend | None) -> CostModel:
    probe = target.tokenize(_PROBE_TEXT, add_special=True)
    return measure_costs(target, draft_model, probe)
