"""One lifecycle for a loaded pair, shared by run, chat and serve: load the models, fit their
contexts to what the command needs, build the drafter its mode asks for (timed on this
machine), and when the command ends write back the decode costs it learned."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..decoding.adaptive import AdaptiveDrafter
from ..decoding.costs import CostModel, shared_pass_costs
from ..decoding.drafters import Drafter
from ..decoding.modes import DrafterMode, build_drafter, costs_of
from ..errors import SpecdecError
from ..llama.rounds import Rounds, SharedContexts
from ..models.loading import (
    ModelLoader,
    ModelPair,
    fit_context,
    load_drafter,
    load_models,
    load_with_llama_cpp,
)
from ..request import DecodeRequest
from .cost_cache import remember_costs
from .drafting import drafter_for


def _learn_together(drafters: list[Drafter | None]) -> None:
    """The slots' planners learn how often drafts are accepted, and how model drafts pay
    against their plans, from every slot's rounds: one slot sees 1/N of the traffic, and a
    planner that learned from few answers drafts with the model where it does not pay (a
    lone request on a 4-slot server ran at 0.85x a 1-slot server's pace until they did).
    What rows cost stays each slot's own (SharedPassCosts)."""
    planners = [d for d in drafters if isinstance(d, AdaptiveDrafter)]
    for planner in planners[1:]:
        planner.acceptance = planners[0].acceptance
        planner.model_realism = planners[0].model_realism


@dataclass
class Slot:
    """A pair that answers one request at a time beside others (LoadedPair.slots)."""

    pair: ModelPair
    drafter: Drafter | None
    rounds: Rounds | None  # the passes it shares with the other slots; None: its own


@dataclass
class LoadedPair:
    """The pair a command runs on; `prepare` once the command knows the context it needs."""

    pair: ModelPair
    request: DecodeRequest
    loader: ModelLoader = load_with_llama_cpp
    drafter: Drafter | None = None
    # Costs the command measured itself, written back where no drafter learned them (bench:
    # its drafting runs' timed decodes, pooled)
    measured: CostModel | None = None

    def prepare(self, needed_context: int) -> Drafter | None:
        """Contexts of `needed_context` tokens (unless --ctx-size), then the drafter."""
        fit_context(self.pair, self.request.hardware, needed_context)
        self.drafter = drafter_for(self.request, self.pair)
        return self.drafter

    def add_drafter(self, name: str, path: Path) -> None:
        """One more drafter to compare, under `name` (bench): loaded beside the target, in a
        context of the target's size."""
        hardware, force = self.request.hardware, self.request.force_incompatible
        backend, by_text = load_drafter(self.pair.target, path, hardware, force, self.loader)
        self.pair.add_drafter(backend, by_text, name)

    @property
    def costs(self) -> CostModel | None:
        """The planner's decode costs as they stand (adaptive modes), else None."""
        return costs_of(self.drafter)

    def slots(self, n: int) -> list[Slot]:
        """`n` pairs that answer requests side by side (serve --parallel): the target's
        context split into `n` sequences whose generated rows share each pass (rounds.py),
        and for each a drafter: a sequence of the drafter's context split the same way, its
        steps in the same rounds; starting from the costs this pair measured. One slot is
        the pair itself."""
        if n == 1:
            return [Slot(self.pair, self.drafter, None)]
        target, draft_model = self.pair.target, self.pair.drafter
        if not isinstance(target, SharedContexts):
            raise SpecdecError("this backend cannot answer requests side by side.")
        by_text = self.pair.drafts_by_text(draft_model)
        costs = self.costs  # rounds are shaped by what passes cost (None: no drafts to shape)
        views = target.split(n, None if costs is None else costs.verify)
        rounds = views[0].rounds
        assert rounds is not None  # a split context's views share rounds
        drafters: list = [None] * n
        if isinstance(draft_model, SharedContexts):  # their steps in the same rounds
            drafters = draft_model.split(n, rounds=rounds)
        slots = []
        for view, draft_view in zip(views, drafters, strict=True):
            pair = ModelPair(view, None, self.pair.costs)
            if draft_view is not None:
                pair.add_drafter(draft_view, by_text)
            drafter = self._slot_drafter(pair, by_text, view.alongside)
            slots.append(Slot(pair, drafter, rounds))
        _learn_together([slot.drafter for slot in slots])
        return slots

    def _slot_drafter(
        self, pair: ModelPair, by_text: bool, alongside: Callable[[], tuple[int, int]]
    ) -> Drafter | None:
        mode = self.request.drafter_mode
        if self.drafter is None or mode == DrafterMode.NONE:
            return None
        costs = self.costs
        priced = None if costs is None else shared_pass_costs(costs, alongside)
        return build_drafter(mode, pair.target, pair.drafter, priced, by_text)

    def remember_costs(self) -> None:
        """The next command on this pair starts from what this one measured."""
        costs = self.costs if self.costs is not None else self.measured
        if costs is not None:
            remember_costs(self.pair, self.request.hardware, costs)


@contextmanager
def loaded_pair(
    request: DecodeRequest, loader: ModelLoader = load_with_llama_cpp
) -> Iterator[LoadedPair]:
    """The request's models, loaded; what they measured is written back however the command
    ends (an error or Ctrl-C included: the timings are as true as a finished run's). The
    models stay open until the process ends: a serve thread that did not stop in time may
    still hold them."""
    loaded = LoadedPair(load_models(request, loader), request, loader)
    try:
        yield loaded
    finally:
        loaded.remember_costs()
