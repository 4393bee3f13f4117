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

import bisect
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise

import numpy as np

from .backend import Backend, Decoder
from .drafters import (
    MODEL_SOURCES,
    NO_MATCH,
    Draft,
    Drafter,
    DraftSource,
    GrowingDrafter,
    ModelDrafter,
    NgramDrafter,
    NgramMatch,
    Outcome,
    PredictionIndex,
    ngram_draft,
)
from .history import HistoryIndex
from .sampling import SamplingSettings, TokenChooser
from .text_drafter import TextDrafter

# Every decode the engine times is a measurement: per batch size, the median of the most
# recent ones is that size's cost (a median, so a decode slowed by something else running
# moves nothing). Drafter steps likewise.
COST_WINDOW = 9
DRAFT_STEP_WINDOW = 15
# A measured size corrects its neighbours by at most this factor either way: no size is
# ever assumed free or hopeless because of one measurement elsewhere.
RATIO_LIMITS = (0.1, 10.0)
MEASURED_SIZES = (1, 2, 4, 8, 16, 32)
# The sizes a cost table keeps: the probed ones and the largest verification (longest draft
# and the target's own token), which the probe leaves to the run (it would add a second or
# more to the probe; until measured it is extrapolated from 16 and 32, a little high).
TABLE_SIZES = (*MEASURED_SIZES, 64)


@dataclass
class CostModel:
    """Seconds for one target decode of n tokens, and for one drafter step.

    `verify_seconds` is the table the run starts from (a probe, or the cache): a prior. On
    CPUs it is far from linear (8 tokens cost 6x one token, 16 barely more than 8, as
    llama.cpp switches kernels), so it is interpolated, not fitted with a line. Each decode
    the engine times then corrects it: a size measured in this run costs the median of its
    recent decodes, and any other size costs the prior's value scaled by the measured/prior
    ratio of the measured sizes around it (interpolated; the nearest one's beyond them). A
    table that is wrong by a factor (probed while the machine was busy) heals from a few
    decodes, and a size never tried keeps the prior's shape at the measured level."""

    verify_seconds: dict[int, float]
    draft_step: float
    learn: bool = True  # refine from each round's timings
    origin: str = "probe"  # where the starting table came from (shown with it)
    trusted: bool = True  # False: a probe that failed its checks (see probe_problems)
    # When this starting table was measured (wall clock; a cache entry's measured_at).
    started_at: float = field(default_factory=time.time)
    _observed: dict[int, deque] = field(default_factory=dict, init=False, repr=False)
    _medians: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _counts: Counter = field(default_factory=Counter, init=False, repr=False)
    _steps: deque = field(
        default_factory=lambda: deque(maxlen=DRAFT_STEP_WINDOW), init=False, repr=False
    )
    _start_step: float = field(default=0.0, init=False, repr=False)
    _dense: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._start_step = self.draft_step

    def verify(self, n_tokens: int) -> float:
        if self._dense is None or n_tokens > len(self._dense):
            self._dense = self._interpolate(max(n_tokens, 64))
        return max(1e-6, float(self._dense[n_tokens - 1]))

    def _interpolate(self, up_to: int) -> np.ndarray:
        sizes = sorted(self._observed)
        prior = _interpolate_table(self.verify_seconds, max(up_to, *sizes, 1))
        if not sizes:
            return prior[:up_to]
        ratios = [self._medians[n] / max(prior[n - 1], 1e-9) for n in sizes]
        ratios = np.clip(ratios, *RATIO_LIMITS)
        wanted = np.arange(1, up_to + 1)
        return prior[:up_to] * np.interp(wanted, sizes, ratios)

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        if self.learn and seconds > 0:
            recent = self._observed.setdefault(n_tokens, deque(maxlen=COST_WINDOW))
            recent.append(seconds)
            self._medians[n_tokens] = float(np.median(recent))
            self._counts[n_tokens] += 1
            self._dense = None

    def observe_draft_step(self, seconds: float) -> None:
        if self.learn and seconds > 0:
            self._steps.append(seconds)
            self.draft_step = float(np.median(self._steps))

    def observations(self, n_tokens: int) -> int:
        """Decodes of n tokens timed so far in this run."""
        return self._counts[n_tokens]

    @property
    def decodes_observed(self) -> int:
        return sum(self._counts.values())

    def table(self) -> dict[int, float]:
        """The target's cost now, at the sizes a probe measures (and the prior's own)."""
        sizes = sorted({*TABLE_SIZES, *self.verify_seconds})
        return {n: self.verify(n) for n in sizes}

    def fresh(self) -> CostModel:
        """The same starting table with nothing learned yet (a new answer's own copy)."""
        return CostModel(
            dict(self.verify_seconds),
            self._start_step,
            self.learn,
            self.origin,
            self.trusted,
            self.started_at,
        )

    def absorb(self, other: CostModel) -> None:
        """Pool another model's timed decodes into this one's (bench: every run's)."""
        for n, samples in other._observed.items():
            for seconds in samples:
                self.observe_verify(n, seconds)
        self._counts.update({n: c - len(other._observed[n]) for n, c in other._counts.items()})
        for seconds in other._steps:
            self.observe_draft_step(seconds)

    def healed(self) -> CostModel:
        """What this run learned, as a starting table for the next."""
        return CostModel(self.table(), self.draft_step, self.learn, "learned", self.trusted)

    def as_dict(self) -> dict:
        """The table the run started from, the one it has now, and how many decodes of each
        size corrected it."""
        return {
            "origin": self.origin,
            "started": _cost_record(self.verify_seconds, self._start_step),
            "now": _cost_record(self.table(), self.draft_step),
            "observed": {str(n): c for n, c in sorted(self._counts.items())},
        }


def _cost_record(table: dict[int, float], step: float) -> dict:
    return {
        "target_decode_ms": {str(n): round(1000 * s, 2) for n, s in sorted(table.items())},
        "draft_step_ms": round(1000 * step, 2),
    }


def _interpolate_table(table: dict[int, float], up_to: int) -> np.ndarray:
    """Seconds for 1..up_to tokens from a table over some sizes: straight lines between
    them, the last slope beyond them."""
    sizes = sorted(table)
    seconds = [table[n] for n in sizes]
    wanted = np.arange(1, up_to + 1)
    dense = np.interp(wanted, sizes, seconds)
    if len(sizes) > 1:
        slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
        beyond = wanted > sizes[-1]
        dense[beyond] = seconds[-1] + slope * (wanted[beyond] - sizes[-1])
    return dense


# A probe's checks. Repeated timings of one size may differ by this factor at most; a
# larger size may cost less than a smaller one by this fraction (kernel switches); n tokens
# may cost this much more than n separate one-token decodes (a batch never should).
PROBE_AGREEMENT = 1.5
PROBE_SHRINK = 0.15
PROBE_BATCH_SLACK = 1.25
PROBE_REPEATS = 2
# ... and any two timings may differ by this much whatever their ratio: the operating
# system's jitter, which only matters for models that decode in a millisecond or less.
PROBE_JITTER = 0.001


@dataclass
class ProbeTimings:
    """A probe's raw timings: seconds per repetition, for each target size and the drafter."""

    verify: dict[int, list[float]]
    draft_step: list[float]

    def merged(self, other: ProbeTimings) -> ProbeTimings:
        return ProbeTimings(
            {n: [*s, *other.verify.get(n, [])] for n, s in self.verify.items()},
            [*self.draft_step, *other.draft_step],
        )


def probe_problems(timings: ProbeTimings) -> list[str]:
    """Why a probe's timings cannot be trusted (none: they can). Something else running
    during a probe shows as samples that disagree, or a batch dearer than its tokens
    decoded one by one, or a longer batch cheaper than a shorter one."""
    problems = []
    for n, samples in sorted(timings.verify.items()):
        if not _agree(samples):
            problems.append(f"{n} tokens: repeated timings disagree ({_ms(samples)})")
    if timings.draft_step and not _agree(timings.draft_step):
        problems.append(f"drafter step: repeated timings disagree ({_ms(timings.draft_step)})")
    table = {n: float(np.median(s)) for n, s in timings.verify.items()}
    return problems + table_problems(table)


def table_problems(table: dict[int, float]) -> list[str]:
    """Shape checks of a cost table: costs grow with n, within a tolerance, and n tokens
    cost no more than about n one-token decodes."""
    problems = []
    sizes = sorted(table)
    for smaller, larger in pairwise(sizes):
        if table[larger] + PROBE_JITTER < (1 - PROBE_SHRINK) * table[smaller]:
            problems.append(f"{larger} tokens cost less than {smaller}")
    one = table.get(1)
    for n in sizes:
        if one is not None and n > 1 and table[n] > PROBE_BATCH_SLACK * n * one + PROBE_JITTER:
            problems.append(f"{n} tokens cost more than {n} one-token decodes")
    return problems


def _agree(samples: Sequence[float]) -> bool:
    return max(samples) <= PROBE_AGREEMENT * min(samples) + PROBE_JITTER


def _ms(samples: Sequence[float]) -> str:
    return "/".join(f"{1000 * s:.0f}" for s in samples) + " ms"


def conservative_table(timings: ProbeTimings) -> dict[int, float]:
    """From timings that failed the checks: each size's fastest sample (something else
    running only ever slows a decode), made to grow with n and capped at n one-token
    decodes, so no draft length starts out looking hopeless."""
    table: dict[int, float] = {}
    for n in sorted(timings.verify):
        fastest = min(timings.verify[n])
        if table:
            fastest = max(fastest, max(table.values()))
        if 1 in table:
            fastest = min(fastest, n * table[1])
        table[n] = fastest
    return table


def measure_costs(
    target: Decoder,
    drafter: Decoder | None,
    probe: Sequence[int],
    drafter_probe: Sequence[int] | None = None,
) -> CostModel:
    """Time the decodes that matter on this machine, on a throwaway probe text, and check
    the timings (see probe_problems). A probe that fails is taken again; if that fails too,
    the run starts from a conservative table built from both, marked untrusted (not to be
    cached) and healed by the run's own decodes."""
    drafter_probe = probe if drafter_probe is None else drafter_probe
    first = _probe(target, drafter, probe, drafter_probe)
    problems = probe_problems(first)
    if not problems:
        return _probed(first, "probe")
    second = _probe(target, drafter, probe, drafter_probe)
    if not probe_problems(second):
        return _probed(second, "probe, second try")
    both = first.merged(second)
    step = min(both.draft_step) if both.draft_step else 0.0
    origin = f"probe failed its checks twice ({problems[0]}): conservative table"
    return CostModel(conservative_table(both), step, origin=origin, trusted=False)


def _probed(timings: ProbeTimings, origin: str) -> CostModel:
    table = {n: float(np.median(s)) for n, s in timings.verify.items()}
    step = float(np.median(timings.draft_step)) if timings.draft_step else 0.0
    return CostModel(table, step, origin=origin)


def _probe(
    target: Decoder, drafter: Decoder | None, probe: Sequence[int], drafter_probe: Sequence[int]
) -> ProbeTimings:
    context = list(probe[: len(probe) - max(MEASURED_SIZES)])
    room = min(target.n_ctx, len(probe)) - len(context)
    verify = {
        n: _decode_seconds(target, context, probe[len(context) : len(context) + n])
        for n in MEASURED_SIZES
        if n <= room
    }
    step = []
    if drafter is not None:  # one step after about as much text as the target's context
        cut = max(1, min(len(drafter_probe) - 1, len(context)))
        step = _decode_seconds(drafter, drafter_probe[:cut], drafter_probe[cut : cut + 1])
    for backend in (target, drafter):
        if backend is not None:
            backend.truncate(0)
    return ProbeTimings(verify, step)


def _decode_seconds(
    backend: Decoder, context: Sequence[int], tail: Sequence[int], reps: int = PROBE_REPEATS
) -> list[float]:
    if backend.cached[: len(context)] != list(context):
        backend.truncate(0)
        backend.decode(context, 1)
    samples = []
    for _ in range(reps):
        backend.truncate(len(context))
        began = time.perf_counter()
        backend.decode(tail, len(tail))
        samples.append(time.perf_counter() - began)
    return samples


@dataclass
class Rate:
    """A success rate learned online, starting from a prior worth `weight` observations and
    forgetting slowly, so it follows the text as it changes (or, with `observe`, a running
    mean of any measured value)."""

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
        self.observe(float(hit))

    def observe(self, value: float) -> None:
        self.hits = self.hits * self.decay + value
        self.total = self.total * self.decay + 1.0


# Model drafts' realised tokens per second over what their plans expected, a running mean
# (a Rate of ratios) that model plans are scaled by. A plan prices the drafter's steps and
# the verification, but not all that a round costs (the drafter catching up after a
# correction, held-back text, overheads) nor acceptance that its confidence misjudges:
# SmolLM2 drafting by text for Qwen on prose kept drafting at 0.77x of the target alone on
# the AVX2 machine before this factor; corrected by what rounds really gave, plans that do
# not pay stop. One round's ratio is taken within these limits (a round that keeps
# everything, or nothing, is mostly luck); the first guess, 1.0, weighs REALISM_WEIGHT
# rounds, and old rounds are forgotten at REALISM_DECAY.
REALISM_LIMITS = (0.25, 2.0)
REALISM_WEIGHT = 4.0
REALISM_DECAY = 0.9


def realism() -> Rate:
    return Rate(1.0, REALISM_WEIGHT, REALISM_DECAY)


CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
# N-gram matches are judged by their length, in these buckets (1, 2, 3, 4, 5-7, 8-11, 12+
# tokens): a match of 12 or more is a copy in progress, one of a few tokens often a chance hit.
NGRAM_LENGTH_EDGES = (2, 3, 4, 5, 8, 12)
# How often an n-gram's continuation starts right, by match-length bucket. Cautious, since
# each wrong guess costs a verification: edits reach these rates and more, prose and fresh
# code far less. Learned per answer.
NGRAM_FIRST_PRIORS = (0.2, 0.4, 0.6, 0.7, 0.75, 0.85, 0.9)
# How often each later token of an n-gram draft is kept, given the one before, by the same
# buckets. Learned per bucket too: a long match runs on (0.99 on edits), while a short one
# right after an edit is a chance hit elsewhere in the text whose continuation soon parts
# from the answer; one shared rate let two-token matches draft 20-32 tokens and lose them
# (1.9 s of 12.6 on a long edit).
NGRAM_NEXT_PRIORS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
# The same for drafts from earlier prompts and answers (history.py; matches of 4 tokens or
# more): what followed there is a guess about this answer's structure (the same keys, the
# same header) more than its content, so trusted a little less than prompt lookup at first.
HISTORY_FIRST_PRIORS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
HISTORY_NEXT_PRIORS = (0.5, 0.5, 0.6, 0.6, 0.7, 0.8, 0.9)
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
    ngram_following: dict[int, Rate] = field(default_factory=dict)
    model_first: Rate = field(default_factory=lambda: Rate(0.6))
    # Each later model draft token, given the one before. Prior: SmolLM2 drafting by text
    # for the Qwen target kept 76% of them over the suite (one prompt per category, 96
    # tokens each, greedy); a by-confidence bucket's rate (0.92) had planned drafts that
    # lost on prose.
    model_following: Rate = field(default_factory=lambda: Rate(0.75))
    prediction_first: dict[int, Rate] = field(default_factory=dict)
    prediction_next: Rate = field(default_factory=lambda: Rate(0.95))
    history_first: dict[int, Rate] = field(default_factory=dict)
    history_following: dict[int, Rate] = field(default_factory=dict)

    def for_confidence(self, confidence: float) -> Rate:
        return self.by_confidence[int(np.searchsorted(CONFIDENCE_EDGES, confidence, "right"))]

    def for_prediction(self, match_length: int) -> Rate:
        return _bucket_rate(self.prediction_first, PREDICTION_FIRST_PRIORS, match_length)

    def for_ngram(self, match_length: int) -> Rate:
        return _ngram_rate(self.ngram_first, NGRAM_FIRST_PRIORS, match_length)

    def ngram_next(self, match_length: int) -> Rate:
        return _ngram_rate(self.ngram_following, NGRAM_NEXT_PRIORS, match_length)

    def for_history(self, match_length: int) -> Rate:
        return _ngram_rate(self.history_first, HISTORY_FIRST_PRIORS, match_length)

    def history_next(self, match_length: int) -> Rate:
        return _ngram_rate(self.history_following, HISTORY_NEXT_PRIORS, match_length)

    def learn(self, draft: Draft, n_accepted: int) -> None:
        checked = min(len(draft.tokens), n_accepted + 1)  # tokens after a rejection are unseen
        for i in range(checked):
            hit = i < n_accepted
            if draft.source in MODEL_SOURCES:
                self.for_confidence(draft.confidences[i]).update(hit)
                (self.model_first if i == 0 else self.model_following).update(hit)
            elif draft.source == DraftSource.NGRAM:
                length = draft.match_length
                (self.for_ngram(length) if i == 0 else self.ngram_next(length)).update(hit)
            elif draft.source == DraftSource.PREDICTION:
                first = self.for_prediction(draft.match_length)
                (first if i == 0 else self.prediction_next).update(hit)
            elif draft.source == DraftSource.HISTORY:
                length = draft.match_length
                (self.for_history(length) if i == 0 else self.history_next(length)).update(hit)


def _bucket_rate(rates: dict[int, Rate], priors: Sequence[float], match_length: int) -> Rate:
    """The rate for a match length: lengths from len(priors) on share the last one."""
    bucket = min(match_length, len(priors))
    if bucket not in rates:
        rates[bucket] = Rate(priors[bucket - 1])
    return rates[bucket]


def _ngram_rate(rates: dict[int, Rate], priors: Sequence[float], match_length: int) -> Rate:
    """The rate for an n-gram match of this length (its NGRAM_LENGTH_EDGES bucket)."""
    return _bucket_rate(rates, priors, 1 + bisect.bisect_right(NGRAM_LENGTH_EDGES, match_length))


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
# A model draft tried while model drafts do not pay: at most this long. It is there to
# learn whether the drafter's first tokens are kept now; grown by the drafter's confidence
# alone it ran to 20-30 tokens on code, each a drafter step (half a target step on CPUs).
MODEL_PROBE_TOKENS = 4
MIN_PROBE_MATCH = 3
# A batch of tokens decoded to catch the drafter up costs about this fraction of as many
# single steps (llama.cpp batches them into one decode).
CATCH_UP_COST = 0.4
# A catch-up is paid once and serves the model drafts of the rounds after it, so a round
# is charged its share: over the rounds the answer may have left, at about two tokens a
# round, at most this many. Charged whole, the drafter's prefill of the prompt (90 tokens:
# 0.45 s for SmolLM2, 1.4 s for the 0.5B drafter on the AVX2 machine) outweighed any one
# round's gain, and the planner drafted with a model only when a probe forced it.
CATCH_UP_ROUNDS = 32
# Decode sizes the planner tries now and then even where the cost table calls them too
# dear, so a table that overprices them (probed on a busy machine) is corrected instead of
# locking drafting off. A try drafts n - 1 tokens from the best source at hand: the
# prediction or an n-gram match of at least MIN_PROBE_MATCH tokens; failing those, when
# there is a draft model, a filler of the text's own last tokens (at most
# FILLER_EXPLORE_TOKENS): the try is there to time the verification, and drafting it with
# the model would add a drafter step per token (on CPUs half a target step) for drafts the
# planner has judged not to pay. The least measured size goes first.
EXPLORE_SIZES = (2, 4, 8, 16, 32, 64)
FILLER_EXPLORE_TOKENS = 7
# A try that moved its size's cost by more than this fraction found the table wrong: the
# next comes soon again. One that did not doubles the wait (ProbeSchedule).
EXPLORE_MOVED = 0.2
# Tries the plan says do not pay (a model probe; an exploration drafted from the text's own
# tokens) are made only where, should one win nothing, the answer would still run at
# 1 - PROBE_BUDGET of the target alone's pace or better: what drafting has saved so far
# (by the cost table's one-token step) plus this fraction of the time the answer has
# taken must cover what the try costs beyond a plain step (for a model probe, the drafter's
# catch-up too). On the AVX2 machine, SmolLM2 drafting for Qwen: unbounded, one model
# probe's catch-up (the drafter reading prompt and answer, 0.46-0.62 s) and two or three
# fillers (0.2 s) cost 96-token prose and QA answers 5-12% of their time for nothing; the
# savings let predictable text (n-gram hits in structured answers) probe early, which is
# where a probe finds model drafts that pay.
PROBE_BUDGET = 0.03


@dataclass
class AdaptiveDrafter:
    """Per round: n-gram draft, model draft, or none, whichever promises the most tokens per
    second; a model draft grows only while its next token pays for itself."""

    costs: CostModel
    model: GrowingDrafter | None = None
    ngram: NgramDrafter | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    margin: float = 1.02  # a plan must beat the target alone by this much
    model_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    ngram_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    cost_probes: ProbeSchedule = field(default_factory=lambda: ProbeSchedule(first=8))
    prediction: PredictionIndex | None = None  # this answer's Predicted Outputs, if any
    history: HistoryIndex | None = None  # earlier prompts and answers (history.py), if kept
    prompt_length: int = 0
    # Model drafts' realised tokens per second over what their plans expected (see realism).
    model_realism: Rate = field(default_factory=realism)
    probe_budget: float = PROBE_BUDGET
    _answer_seconds: float = field(default=0.0, init=False, repr=False)  # this answer's rounds
    # What this answer's rounds saved against the target alone (negative: what they lost).
    _saved_seconds: float = field(default=0.0, init=False, repr=False)
    _exploring: tuple[int, float] | None = field(default=None, init=False, repr=False)
    _model_plan: float = field(default=0.0, init=False, repr=False)  # the last one's rate

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        match, k, ngram_rate = self._ngram_plan(context, max_tokens)
        predicted, k_predicted, prediction_rate = self._prediction_plan(context, max_tokens)
        earlier, k_earlier, history_rate = self._history_plan(context, max_tokens)
        planned = max(k, k_predicted, k_earlier) + 1  # the size the free sources would decode
        explored = self._explore(context, max_tokens, predicted, match, planned)
        if explored is not None:
            return explored
        plain_rate = 1.0 / self.costs.verify(1)
        catch_up = self._catch_up_seconds(context, max_tokens)
        planned_model_rate = self._model_rate(max_tokens, *self._model_acceptance(), catch_up)
        model_rate = planned_model_rate * self.model_realism.value
        best_other = max(model_rate, ngram_rate, history_rate, plain_rate * self.margin)
        if self.prediction is not None and k_predicted and prediction_rate >= best_other:
            return self.prediction.take(predicted, k_predicted)
        if k_earlier and history_rate >= max(model_rate, ngram_rate, plain_rate * self.margin):
            return ngram_draft(earlier.tokens[:k_earlier], earlier.length, DraftSource.HISTORY)
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
        self._model_plan = planned_model_rate
        if model_rate > plain_rate * self.margin:
            self.model_probes.paid()
            return self._model_draft(context, max_tokens, sampling, chooser)
        # A probe only if a model draft could pay at all, were the drafter always right.
        if (
            self._model_rate(max_tokens, 0.95, 0.95, catch_up) > plain_rate
            and self.model_probes.due()
            and self._affordable(self._model_probe_seconds(context))
        ):
            self.model_probes.probed()
            return self._model_draft(
                context, min(max_tokens, MODEL_PROBE_TOKENS), sampling, chooser, at_least=1
            )
        self.model_probes.skipped()
        return Draft.empty()

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.prompt_length = prompt_length
        self._answer_seconds = self._saved_seconds = 0.0
        if self.ngram is not None:
            self.ngram.begin(prompt_length, prediction)
        self.prediction = PredictionIndex(prediction) if prediction else None

    def observe(self, outcome: Outcome) -> None:
        draft = outcome.draft
        self.acceptance.learn(draft, outcome.n_accepted)
        self._account(outcome)
        if draft.source in MODEL_SOURCES and self._model_plan > 0 and draft.tokens:
            seconds = outcome.draft_seconds + outcome.verify_seconds
            if seconds > 0 and not outcome.includes_prompt:
                ratio = (outcome.n_accepted + 1) / seconds / self._model_plan
                self.model_realism.observe(float(np.clip(ratio, *REALISM_LIMITS)))
        self._model_plan = 0.0
        if not outcome.includes_prompt:
            self.costs.observe_verify(len(draft.tokens) + 1, outcome.verify_seconds)
        if self._exploring is not None:
            size, before = self._exploring
            self._exploring = None
            if abs(self.costs.verify(size) - before) > EXPLORE_MOVED * before:
                self.cost_probes.paid()
        if self.model is not None:
            for seconds in self.model.step_seconds:
                self.costs.observe_draft_step(seconds)
            self.model.step_seconds.clear()

    def _account(self, outcome: Outcome) -> None:
        """The answer's time so far, and what its rounds saved against the target alone."""
        seconds = outcome.draft_seconds + outcome.verify_seconds
        self._answer_seconds += seconds
        if not outcome.includes_prompt:  # the target alone decodes the prompt too
            self._saved_seconds += (outcome.n_accepted + 1) * self.costs.verify(1) - seconds

    # -- exploring costs -------------------------------------------------------------------

    def _explore(
        self,
        context: Sequence[int],
        max_tokens: int,
        predicted: NgramMatch,
        match: NgramMatch,
        planned: int,
    ) -> Draft | None:
        """When due, a draft of a size the table knows least (see EXPLORE_SIZES), whatever
        the table says it costs; None otherwise. Only sizes above `planned`, what the free
        sources' plans (`predicted`, `match`, history) decode now: those are the ones a
        table that overprices them keeps from being drafted (a smaller try would only cut a
        good draft short)."""
        if not self.costs.learn:
            return None
        if not self.cost_probes.due():
            self.cost_probes.skipped()
            return None
        if match.length < MIN_PROBE_MATCH:
            match = NO_MATCH
        filler_tokens = min(FILLER_EXPLORE_TOKENS, len(context)) if self.model is not None else 0
        drafted = max(len(predicted.tokens), len(match.tokens))
        available = min(max_tokens, max(drafted, filler_tokens))
        sizes = [
            n
            for n in EXPLORE_SIZES
            if planned < n <= available + 1
            and (n <= drafted + 1 or self._affordable(self.costs.verify(n) - self.costs.verify(1)))
        ]
        if not sizes:
            return None  # nothing to draft from now, or the plan already decodes more: stay due
        size = min(sizes, key=lambda n: (self.costs.observations(n), n))
        k = size - 1
        self.cost_probes.probed()
        self._exploring = (size, self.costs.verify(size))
        if self.prediction is not None and len(predicted.tokens) >= k:
            return self.prediction.take(predicted, k)
        if self.ngram is not None and len(match.tokens) >= k:
            return self.ngram.take(match, k)
        return ngram_draft(context[len(context) - k :], 0, DraftSource.EXPLORE)

    def _affordable(self, seconds: float) -> bool:
        """Whether a try costing `seconds` beyond a plain step keeps the answer within
        PROBE_BUDGET of the target alone's pace, should it win nothing."""
        # Divided, not multiplied: an infinite budget (tests) affords anything from the start.
        return (seconds - self._saved_seconds) / self.probe_budget <= self._answer_seconds

    def _model_probe_seconds(self, context: Sequence[int]) -> float:
        """What a model probe costs beyond a plain step: the drafter's whole catch-up (a
        probe's rarely serves drafts after it), its steps and the longer verification."""
        assert self.model is not None
        step = self.costs.draft_step
        catch_up = self.model.behind(context) * step * CATCH_UP_COST
        size = MODEL_PROBE_TOKENS + 1
        return catch_up + size * step + self.costs.verify(size) - self.costs.verify(1)

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
        following = self.acceptance.prediction_next
        return self._match_plan(match, self.acceptance.for_prediction, lambda _: following)

    def _ngram_plan(self, context: Sequence[int], max_tokens: int) -> tuple[NgramMatch, int, float]:
        """The match (looked up, not taken), the best length to use (0: none), its rate."""
        if self.ngram is None:
            return NO_MATCH, 0, 0.0
        match = self.ngram.candidates(context, max_tokens)
        return self._match_plan(match, self.acceptance.for_ngram, self.acceptance.ngram_next)

    def _history_plan(
        self, context: Sequence[int], max_tokens: int
    ) -> tuple[NgramMatch, int, float]:
        """What earlier prompts and answers say comes next, the best length (0: none), its rate."""
        if self.history is None:
            return NO_MATCH, 0, 0.0
        match = self.history.lookup(context, max_tokens)
        return self._match_plan(match, self.acceptance.for_history, self.acceptance.history_next)

    def _match_plan(
        self,
        match: NgramMatch,
        first: Callable[[int], Rate],
        following: Callable[[int], Rate],
    ) -> tuple[NgramMatch, int, float]:
        """A point-mass draft of `match` (free to propose, so only verification costs), its
        first token and the rest trusted at the rates for its match length: the match, the
        best length (0: none) and its rate."""
        if not match.tokens:
            return match, 0, 0.0
        rates = first(match.length).value, following(match.length).value
        return match, *self._best_length(*rates, len(match.tokens), 0.0)

    def _model_acceptance(self) -> tuple[float, float]:
        return self.acceptance.model_first.value, self.acceptance.model_following.value

    def _model_rate(
        self, max_tokens: int, first: float, following: float, catch_up: float
    ) -> float:
        if self.model is None:
            return 0.0
        step = self.costs.draft_step
        # One step more than the draft's tokens: the one whose token ends the draft.
        return self._best_length(first, following, max_tokens, step, catch_up + step)[1]

    def _catch_up_seconds(self, context: Sequence[int], max_tokens: int) -> float:
        """A round's share of bringing the drafter's cache up to the text before it can
        draft (after rounds without model drafts it is behind by every token since)."""
        if self.model is None:
            return 0.0
        rounds = max(1, min(CATCH_UP_ROUNDS, max_tokens // 2))
        return self.model.behind(context) * self.costs.draft_step * CATCH_UP_COST / rounds

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
        survive, expected = 1.0, 1.0  # P(all drafted so far kept); expected tokens emitted

        def worth_it(k: int, sure: float) -> bool:
            """Keep the k-th token only if it raises the round's expected tokens per second."""
            nonlocal survive, expected
            keep = survive * self.acceptance.for_confidence(sure).value
            spent = (k + 1) * self.costs.draft_step
            # With it, one more step (the one that decides after it), and one more row.
            with_it = (expected + keep) / (spent + self.costs.draft_step + self.costs.verify(k + 2))
            if k >= at_least and with_it <= expected / (spent + self.costs.verify(k + 1)):
                return False
            survive, expected = keep, expected + keep
            return True

        return model.grow(context, max_tokens, sampling, chooser, worth_it)


class DrafterMode(str, Enum):
    """--drafter: how each round's draft is made (see build_drafter)."""

    __str__ = str.__str__  # shown as "combined", not "DrafterMode.COMBINED"

    COMBINED = "combined"
    MODEL = "model"
    NGRAM = "ngram"
    FIXED = "fixed"
    NONE = "none"  # the target alone (--no-draft)

    @property
    def needs_draft_model(self) -> bool:
        return self in (DrafterMode.COMBINED, DrafterMode.MODEL, DrafterMode.FIXED)


# The modes that draft (build_drafter makes them).
DRAFTER_MODES = tuple(mode.value for mode in DrafterMode if mode is not DrafterMode.NONE)
FIXED_DRAFT_LENGTH = 8
# Adaptive modes choose each round's length themselves; this only bounds it. Long n-gram
# drafts are what pay on CPU: with llama.cpp's kernels one decode of 32 tokens costs about
# 6.7 single-token decodes and one of 64 about 10.7 (a fifth less per token), so a copy in
# progress is verified 64 tokens at a time. 63 + 1 is exact mode's invariant batch limit.
ADAPTIVE_DRAFT_LIMIT = 63


def needs_draft_model(mode: str) -> bool:
    """Whether a --drafter mode (or bench's) drafts with a draft model."""
    return mode in DRAFTER_MODES and DrafterMode(mode).needs_draft_model


def default_draft_max(mode: str) -> int:
    adaptive = mode not in (DrafterMode.FIXED, DrafterMode.NONE)
    return ADAPTIVE_DRAFT_LIMIT if adaptive else FIXED_DRAFT_LENGTH


_PROBE_TEXT = (
    "def mean(values):\n    return sum(values) / len(values)\n\n"
    "def variance(values):\n    m = mean(values)\n"
    "    return sum((v - m) ** 2 for v in values) / len(values)\n\n"
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
    "with a single step, and every long answer begins with a single token."
)


def build_drafter(
    mode: str,
    target: Backend,
    draft_model: Backend | None,
    costs: CostModel | None = None,
    by_text: bool = False,
) -> Drafter:
    """The drafter for a --drafter mode:
    fixed     the draft model, always --draft-max tokens (the classic loop);
    model     the draft model, lengths chosen each round from costs and confidence;
    ngram     prompt lookup only: no draft model needed;
    combined  an n-gram match when one promises more, else the draft model, else neither.
    `by_text`: the draft model has another vocabulary and drafts by text (text_drafter)."""
    if mode not in DRAFTER_MODES:
        raise ValueError(f"unknown drafter mode {mode!r}")
    if mode == DrafterMode.FIXED:
        if draft_model is None:
            raise ValueError("the fixed mode drafts with a draft model; none was given")
        return model_drafter(target, draft_model, by_text)
    model = (
        model_drafter(target, draft_model, by_text)
        if draft_model and mode != DrafterMode.NGRAM
        else None
    )
    costs = costs or measure_pair_costs(target, draft_model if model else None, by_text)
    ngram = NgramDrafter() if mode in (DrafterMode.COMBINED, DrafterMode.NGRAM) else None
    return AdaptiveDrafter(costs, model=model, ngram=ngram)


def model_drafter(
    target: Backend, draft_model: Backend, by_text: bool
) -> ModelDrafter | TextDrafter:
    if not by_text:
        return ModelDrafter(draft_model)
    return TextDrafter(draft_model, target, target_bos=_bos(target), drafter_bos=_bos(draft_model))


def _bos(backend: Backend) -> int | None:
    """The token a model starts each text with, if it adds one."""
    info = backend.vocab_info()
    return info.bos if info.add_bos and info.bos >= 0 else None


def use_history(drafter: Drafter | None, history: HistoryIndex | None) -> None:
    """Let an adaptive drafter draft from earlier prompts and answers too."""
    if isinstance(drafter, AdaptiveDrafter):
        drafter.history = history


def costs_of(drafter: Drafter | None) -> CostModel | None:
    """The cost model a drafter plans with and learns into (adaptive modes only)."""
    return drafter.costs if isinstance(drafter, AdaptiveDrafter) else None


def measure_pair_costs(
    target: Backend, draft_model: Backend | None, by_text: bool = False
) -> CostModel:
    """Time the pair on the probe text; a drafter of another vocabulary (`by_text`) is
    timed on its own tokens for it."""
    probe = target.tokenize(_PROBE_TEXT, add_special=True)
    drafter_probe = (
        draft_model.tokenize(_PROBE_TEXT, add_special=True) if by_text and draft_model else probe
    )
    return measure_costs(target, draft_model, probe, drafter_probe)
