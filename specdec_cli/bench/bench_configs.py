"""Bench configurations: what is compared with the target alone, and their drafters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from ..decoding.costs import CostModel
from ..decoding.drafters import Draft, Drafter, DraftSource, Outcome, ngram_draft
from ..decoding.engine import GenerationSettings
from ..decoding.history import HistoryIndex
from ..decoding.modes import (
    DRAFTER_MODES,
    DrafterMode,
    build_drafter,
    default_draft_max,
    use_history,
)
from ..decoding.policy import ADAPTIVE_DRAFT_LIMIT
from ..decoding.sampling import SamplingSettings, TokenChooser
from ..errors import BadUsageError
from ..models.loading import ModelPair


class BenchOnly(str, Enum):
    """Drafting modes only bench offers: measuring instruments, not ways to answer."""

    __str__ = str.__str__  # shown as "oracle", as DrafterMode's values are

    ORACLE = "oracle"  # drafts the target alone's own answer: the ceiling


BenchMode = DrafterMode | BenchOnly

TARGET_ALONE = "target alone"  # always llama.cpp's default kernels: the speed to beat
EXACT_ALONE = "target alone, exact"  # batch-invariant kernels: the answer exact mode keeps
ORACLE = str(BenchOnly.ORACLE)  # the oracle's label
BENCH_MODES = (*DRAFTER_MODES, ORACLE)
INSTRUMENTS = (EXACT_ALONE, ORACLE)  # measured for reference, never "the best configuration"

PREDICTION_SUFFIX = "+prediction"
HISTORY_SUFFIX = "+history"


@dataclass(frozen=True)
class BenchDrafter:
    """One --drafter entry: a mode, and whether its drafts may also follow the prompts'
    predictions and the session's history (adaptive modes only)."""

    mode: BenchMode
    prediction: bool = False
    history: bool = False

    @property
    def name(self) -> str:
        """As --drafter spells it: 'combined+prediction+history'."""
        suffixes = (PREDICTION_SUFFIX,) * self.prediction + (HISTORY_SUFFIX,) * self.history
        return str(self.mode) + "".join(suffixes)

    @property
    def needs_draft_model(self) -> bool:
        return isinstance(self.mode, DrafterMode) and self.mode.needs_draft_model

    @classmethod
    def parse(cls, text: str) -> BenchDrafter:
        """'ngram+history+prediction' -> BenchDrafter(NGRAM, prediction=True, history=True)."""
        mode, suffixes = text, set[str]()
        ends = (PREDICTION_SUFFIX, HISTORY_SUFFIX)
        while suffix := next((end for end in ends if mode.endswith(end)), ""):
            mode, suffixes = mode[: -len(suffix)], suffixes | {suffix}
        follows = bool(suffixes)
        if mode not in BENCH_MODES or (follows and mode in (DrafterMode.FIXED, ORACLE)):
            raise BadUsageError(
                f"unknown drafter '{text}'.",
                f"Use one of {', '.join(BENCH_MODES)}; an adaptive mode (combined, model, ngram) "
                f"may end in {PREDICTION_SUFFIX} to follow the prompts' predictions and in "
                f"{HISTORY_SUFFIX} to draft from the session's earlier requests.",
            )
        typed: BenchMode = BenchOnly(mode) if mode == ORACLE else DrafterMode(mode)
        return cls(typed, PREDICTION_SUFFIX in suffixes, HISTORY_SUFFIX in suffixes)


def parse_drafters(text: str) -> list[BenchDrafter]:
    """--drafter's list, each entry checked; an entry given twice is compared once."""
    entries = [BenchDrafter.parse(entry.strip()) for entry in text.split(",") if entry.strip()]
    return list(dict.fromkeys(entries))


@dataclass(frozen=True)
class Configuration:
    """One way of running speculatively: a drafting mode and its settings, under a label."""

    label: str
    drafter: BenchDrafter = BenchDrafter(DrafterMode.COMBINED)
    draft_max: int = 8
    draft_model: str | None = None  # one of the extra drafters by name; None: the main one

    @property
    def mode(self) -> BenchMode:
        """The drafting mode; see modes.build_drafter."""
        return self.drafter.mode

    def settings(self, base: GenerationSettings) -> GenerationSettings:
        prediction = base.prediction if self.drafter.prediction else ()
        return replace(base, draft_max=self.draft_max, prediction=prediction)

    def as_dict(self) -> dict:
        """As the JSON report gives it: the drafter's mode and its two switches side by side."""
        return {
            "label": self.label,
            "drafter": self.mode,
            "draft_max": self.draft_max,
            "draft_model": self.draft_model,
            "prediction": self.drafter.prediction,
            "history": self.drafter.history,
        }


def configurations(
    draft_max: Sequence[int] | None,
    drafters: Sequence[BenchDrafter] = (BenchDrafter(DrafterMode.COMBINED),),
    extra_drafts: Sequence[str] = (),
    exact: bool = False,
) -> list[Configuration]:
    """Every drafter at every draft length, in that order (a --draft-max sweep is one axis);
    without lengths, each at its mode's default. Modes that use a draft model run once more
    with each extra drafter. Exact benches first run the target alone with the exact
    kernels: what exactness costs, and the answer every exact configuration must give."""
    found = [Configuration(EXACT_ALONE, BenchDrafter(DrafterMode.NONE), 1)] if exact else []
    for drafter in drafters:
        if drafter.mode == BenchOnly.ORACLE:  # its lengths come from the cost table
            found.append(Configuration(ORACLE, drafter, ADAPTIVE_DRAFT_LIMIT))
            continue
        drafts = [None, *extra_drafts] if drafter.needs_draft_model else [None]
        for draft in drafts:
            for k in dict.fromkeys(draft_max or [default_draft_max(drafter.mode)]):
                label = f"{drafter.name} k={k}" + (f" ({draft})" if draft else "")
                found.append(Configuration(label, drafter, k, draft))
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
    mode = configuration.mode
    if mode == DrafterMode.NONE:
        return None
    if mode == BenchOnly.ORACLE:
        assert pair.costs is not None  # measured before any run
        return OracleDrafter(tuple(reference), pair.costs)
    assert isinstance(mode, DrafterMode)
    drafter, costs = pair.drafter, pair.costs
    if configuration.draft_model is not None:
        drafter, costs = pair.alternates[configuration.draft_model]
    if mode.needs_draft_model and drafter is None:
        raise BadUsageError(f"the '{mode}' drafter needs a draft model.", "Pass --draft.")
    fresh = costs.fresh() if costs is not None else None  # each run learns on its own copy
    by_text = pair.drafts_by_text(drafter)
    built = build_drafter(mode, pair.target, drafter, fresh, by_text)
    use_history(built, history if configuration.drafter.history else None)
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
