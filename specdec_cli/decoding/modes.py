"""The drafting modes (--drafter) and the drafter each one builds."""

from __future__ import annotations

from enum import Enum

from .adaptive import AdaptiveDrafter
from .backend import Backend
from .costs import CostModel, measure_costs
from .drafters import (
    Drafter,
    ModelDrafter,
    NgramDrafter,
)
from .history import HistoryIndex
from .policy import ADAPTIVE_DRAFT_LIMIT, FIXED_DRAFT_LENGTH
from .text_drafter import TextDrafter


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
