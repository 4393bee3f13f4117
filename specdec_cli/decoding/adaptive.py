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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .costs import CostModel
from .drafters import (
    MODEL_SOURCES,
    NO_MATCH,
    Draft,
    DraftSource,
    GrowingDrafter,
    NgramDrafter,
    NgramMatch,
    Outcome,
    PredictionIndex,
    ngram_draft,
)
from .history import HistoryIndex
from .learned_rates import AcceptanceModel, Rate, realism
from .policy import (
    CATCH_UP_ROUNDS,
    EXPLORE_FIRST_WAIT,
    EXPLORE_MOVED,
    EXPLORE_SIZES,
    FILLER_EXPLORE_TOKENS,
    MIN_PROBE_MATCH,
    MODEL_PROBE_TOKENS,
    PLAN_MARGIN,
    PROBE_BUDGET,
    PROBE_TOKENS,
    REALISM_LIMITS,
    TRY_FIRST_WAIT,
    TRY_LONGEST_WAIT,
)
from .sampling import SamplingSettings, TokenChooser


@dataclass
class ProbeSchedule:
    """A kind of draft that does not pay is still tried now and then, to notice when the
    text becomes predictable; each fruitless try doubles the wait."""

    first: int = TRY_FIRST_WAIT
    longest: int = TRY_LONGEST_WAIT
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


@dataclass
class AdaptiveDrafter:
    """Per round: n-gram draft, model draft, or none, whichever promises the most tokens per
    second; a model draft grows only while its next token pays for itself."""

    costs: CostModel
    model: GrowingDrafter | None = None
    ngram: NgramDrafter | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    margin: float = PLAN_MARGIN  # a plan must beat the target alone by this much
    model_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    ngram_probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    cost_probes: ProbeSchedule = field(default_factory=lambda: ProbeSchedule(EXPLORE_FIRST_WAIT))
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
                # A short n-gram guess (where two rows cost about one, a chance match of a
                # token or two wins on price alone) must not keep model drafts from ever
                # being tried: they may pay more than their priors say.
                if k <= MODEL_PROBE_TOKENS:
                    self._model_plan = planned_model_rate
                    probe = self._model_probe(context, max_tokens, sampling, chooser, catch_up)
                    if probe is not None:
                        return probe
                self.ngram_probes.paid()
                return self.ngram.take(match, k)
            if match.length >= MIN_PROBE_MATCH and self.ngram_probes.due():
                self.ngram_probes.probed()
                return self.ngram.take(match, PROBE_TOKENS)
            self.ngram_probes.skipped()
        if self.model is None:
            return Draft.empty()
        self._model_plan = planned_model_rate
        if model_rate > plain_rate * self.margin and self._catch_up_affordable(context):
            self.model_probes.paid()
            return self._model_draft(context, max_tokens, sampling, chooser)
        probe = self._model_probe(context, max_tokens, sampling, chooser, catch_up)
        return probe if probe is not None else Draft.empty()

    def plan_forced(self, forced: Sequence[int], ends: bool = False) -> Draft:
        """The text a constraint forces next, `forced`, as far as it pays: free to propose,
        with its own acceptance (a grammar's spacing or another tokenisation can part from
        the target's), and none where a plain step pays more (beside other requests' rows).
        `ends`: its last token ends the answer; then all of it where one pass of it all
        costs no more than the planned part and a pass for the rest (which the answer
        cannot do without)."""
        first = self.acceptance.forced_first.value
        following = self.acceptance.forced_following.value
        k, rate = self._best_length(first, following, len(forced), 0.0)
        if k == 0 or rate < self.margin / self.costs.verify(1):
            return Draft.empty()
        if ends and k < len(forced):
            verify = self.costs.verify_sizes(len(forced) + 1)
            if verify[len(forced)] <= verify[k] + verify[len(forced) - k - 1]:
                k = len(forced)
        return ngram_draft(forced[:k], 0, DraftSource.FORCED)

    def _model_probe(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
        catch_up: float,
    ) -> Draft | None:
        """A short model draft when one is due (model drafts were not chosen), could pay at
        all were the drafter always right, and is affordable (PROBE_BUDGET); else None, and
        the wait goes on."""
        if self.model is None:
            return None
        plain_rate = 1.0 / self.costs.verify(1)
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
        return None

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
            timings = self.model.timings
            for seconds in timings.steps:
                self.costs.observe_draft_step(seconds)
            for tokens, seconds in timings.catch_ups:
                self.costs.observe_catch_up(tokens, seconds)
            timings.clear()

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
        if not self.costs.learning:  # beside other requests (serve --parallel) it learns nothing
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

    def _catch_up_affordable(self, context: Sequence[int]) -> bool:
        """Whether the drafter's catch-up before a planned model draft keeps the answer
        within PROBE_BUDGET of the target alone's pace, should the drafts win nothing. Its
        first is the whole prompt, paid at once: a short answer (an agent's turn after a
        tool's result) never wins it back, whatever share of it a round is charged."""
        return self._affordable(self._catch_up_whole(context))

    def _catch_up_whole(self, context: Sequence[int]) -> float:
        """What bringing the drafter's cache up to `context` costs, paid at once."""
        assert self.model is not None
        return self.costs.catch_up(self.model.behind(context))

    def _model_probe_seconds(self, context: Sequence[int]) -> float:
        """What a model probe costs beyond a plain step: the drafter's whole catch-up (a
        probe's rarely serves drafts after it), its steps and the longer verification."""
        assert self.model is not None
        step = self.costs.draft_step
        size = MODEL_PROBE_TOKENS + 1
        return (
            self._catch_up_whole(context)
            + size * step
            + self.costs.verify(size)
            - self.costs.verify(1)
        )

    # -- planning --------------------------------------------------------------------------

    def _best_length(
        self, first: float, following: float, max_tokens: int, step: float, setup: float = 0.0
    ):
        """The draft length with the most expected tokens per second, and that rate."""
        verify = self.costs.verify_sizes(max_tokens + 1)
        best_k, best_rate = 0, 1.0 / verify[0]
        expected, survives = 1.0, first  # expected_tokens(first, following, k), k by k
        for k in range(1, max_tokens + 1):
            expected += survives
            survives *= following
            rate = expected / (setup + k * step + verify[k])
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
        return self._catch_up_whole(context) / rounds

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
