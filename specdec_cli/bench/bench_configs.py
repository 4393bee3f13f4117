"""Bench configurations: what is compared with the target alone, and their drafters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from ..decoding.costs import CostModel
from ..decoding.drafters import Draft, Drafter, DraftSource, Outcome, ngram_draft
from ..decoding.engine import GenerationSettings
from ..decoding.history import HistoryIndex
from ..decoding.modes import (
    DRAFTER_MODES,
    DrafterMode,
    build_drafter,
    default_draft_max,
    needs_draft_model,
    use_history,
)
from ..decoding.policy import ADAPTIVE_DRAFT_LIMIT
from ..decoding.sampling import SamplingSettings, TokenChooser
from ..errors import BadUsageError
from ..models.loading import ModelPair

TARGET_ALONE = "target alone"  # always llama.cpp's default kernels: the speed to beat
EXACT_ALONE = "target alone, exact"  # batch-invariant kernels: the answer exact mode keeps
ORACLE = "oracle"  # a drafting mode only bench offers: drafts the target alone's own answer
BENCH_MODES = (*DRAFTER_MODES, ORACLE)
INSTRUMENTS = (EXACT_ALONE, ORACLE)  # measured for reference, never "the best configuration"


@dataclass(frozen=True)
class Configuration:
    """One way of running speculatively: a drafting mode and its settings, under a label."""

    label: str
    drafter: str = "combined"  # the drafting mode; see adaptive.build_drafter
    draft_max: int = 8
    draft_model: str | None = None  # one of the extra drafters by name; None: the main one
    prediction: bool = False  # drafts may follow the prompt's prediction (Predicted Outputs)
    history: bool = False  # drafts may follow the session's earlier prompts and answers

    def settings(self, base: GenerationSettings) -> GenerationSettings:
        prediction = base.prediction if self.prediction else ()
        return replace(base, draft_max=self.draft_max, prediction=prediction)

    def as_dict(self) -> dict:
        return asdict(self)


def configurations(
    draft_max: Sequence[int] | None,
    modes: Sequence[str] = ("combined",),
    extra_drafts: Sequence[str] = (),
    exact: bool = False,
) -> list[Configuration]:
    """Every mode at every draft length, in that order (a --draft-max sweep is one axis);
    without lengths, each mode at its default. Modes that use a draft model run once more
    with each extra drafter. Exact benches first run the target alone with the exact
    kernels: what exactness costs, and the answer every exact configuration must give."""
    for mode in modes:
        check_bench_mode(mode)
    found = [Configuration(EXACT_ALONE, DrafterMode.NONE, 1)] if exact else []
    for mode_name in modes:
        mode, predicted, history = split_mode(mode_name)
        drafts = [None, *extra_drafts] if needs_draft_model(mode) else [None]
        for draft in drafts:
            if mode == ORACLE:  # its lengths come from the cost table, as long as pays
                found.append(Configuration(ORACLE, ORACLE, ADAPTIVE_DRAFT_LIMIT))
                continue
            for k in dict.fromkeys(draft_max or [default_draft_max(mode)]):
                label = f"{mode_name} k={k}" + (f" ({draft})" if draft else "")
                found.append(Configuration(label, mode, k, draft, predicted, history))
    return found


@dataclass
class OracleDrafter:
    """The ceiling: drafts the target alone's own answer to the same prompt, obtained in the
    same run, so every draft is kept. Each round drafts the length with the most tokens per
    second in the measured cost table; once the answer has left that text (it cannot in
    exact mode), nothing. A measuring instrument: only bench offers it."""

    reference: tuple[int, ...]
    costs: CostModel
    prompt_length: int = 0

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.prompt_length = prompt_length

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        answer = tuple(context[self.prompt_length :])
        if self.reference[: len(answer)] != answer:
            return Draft.empty()
        rest = self.reference[len(answer) : len(answer) + max_tokens]
        k = max(range(len(rest) + 1), key=lambda k: (k + 1) / self.costs.verify(k + 1))
        return ngram_draft(rest[:k], len(answer), DraftSource.ORACLE) if k else Draft.empty()

    def observe(self, outcome: Outcome) -> None:
        pass


PREDICTION_SUFFIX = "+prediction"
HISTORY_SUFFIX = "+history"


def split_mode(name: str) -> tuple[str, bool, bool]:
    """'combined+prediction+history' -> ('combined', True, True): the mode, whether its
    drafts may follow the prompt's prediction, and the session's history."""
    mode, suffixes = name, set[str]()
    while suffix := next((s for s in (PREDICTION_SUFFIX, HISTORY_SUFFIX) if mode.endswith(s)), ""):
        mode, suffixes = mode[: -len(suffix)], suffixes | {suffix}
    return mode, PREDICTION_SUFFIX in suffixes, HISTORY_SUFFIX in suffixes


def parse_modes(text: str) -> tuple[list[str], bool]:
    """--drafter's list (each checked), and whether any of them drafts with a draft model."""
    modes = [check_bench_mode(mode.strip()) for mode in text.split(",") if mode.strip()]
    return modes, any(needs_draft_model(split_mode(mode)[0]) for mode in modes)


def check_bench_mode(name: str) -> str:
    mode, predicted, history = split_mode(name)
    if mode not in BENCH_MODES or ((predicted or history) and mode in (DrafterMode.FIXED, ORACLE)):
        raise BadUsageError(
            f"unknown drafter '{name}'.",
            f"Use one of {', '.join(BENCH_MODES)}; an adaptive mode (combined, model, ngram) "
            f"may end in {PREDICTION_SUFFIX} to follow the prompts' predictions and in "
            f"{HISTORY_SUFFIX} to draft from the session's earlier requests.",
        )
    return name


def make_drafter(
    configuration: Configuration,
    pair: ModelPair,
    reference: Sequence[int] = (),
    history: HistoryIndex | None = None,
) -> Drafter | None:
    """The one place a configuration becomes a drafter (fresh per run: drafters learn as they
    go). The pair's costs, measured once per bench, spare each run its own timing probe.
    `reference`: the target alone's answer in this repeat, for the oracle; `history`: the
    session's earlier prompts and answers, for "+history" modes."""
    if configuration.drafter == DrafterMode.NONE:
        return None
    if configuration.drafter == ORACLE:
        assert pair.costs is not None  # measured before any run
        return OracleDrafter(tuple(reference), pair.costs)
    drafter, costs = pair.drafter, pair.costs
    if configuration.draft_model is not None:
        drafter, costs = pair.alternates[configuration.draft_model]
    if needs_draft_model(configuration.drafter) and drafter is None:
        raise BadUsageError(
            f"the '{configuration.drafter}' drafter needs a draft model.", "Pass --draft."
        )
    fresh = costs.fresh() if costs is not None else None  # each run learns on its own copy
    by_text = pair.drafts_by_text(drafter)
    built = build_drafter(configuration.drafter, pair.target, drafter, fresh, by_text)
    use_history(built, history if configuration.history else None)
    return built


def parse_int_list(text: str, option: str, largest: int | None = None) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BadUsageError(
            f"{option} takes positive integers separated by commas, got '{text}'.",
            f"For example {option} 2,4,8.",
        )
    if largest is not None and max(values) > largest:
        raise BadUsageError(
            f"{option} {max(values)} is more than the longest draft, {largest}.",
            f"Give values from 1 to {largest}.",
        )
    return values
