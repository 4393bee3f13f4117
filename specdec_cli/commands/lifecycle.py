"""One lifecycle for a loaded pair, shared by run, chat and serve: load the models, fit their
contexts to what the command needs, build the drafter its mode asks for (timed on this
machine), and when the command ends write back the decode costs it learned."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..decoding.costs import CostModel
from ..decoding.drafters import Drafter
from ..decoding.modes import costs_of
from ..models.loading import ModelLoader, ModelPair, fit_context, load_models, load_with_llama_cpp
from ..request import DecodeRequest
from .cost_cache import remember_costs
from .drafting import drafter_for


@dataclass
class LoadedPair:
    """The pair a command runs on; `prepare` once the command knows the context it needs."""

    pair: ModelPair
    request: DecodeRequest
    drafter: Drafter | None = None

    def prepare(self, needed_context: int) -> Drafter | None:
        """Contexts of `needed_context` tokens (unless --ctx-size), then the drafter."""
        fit_context(self.pair, self.request.hardware, needed_context)
        self.drafter = drafter_for(self.request, self.pair)
        return self.drafter

    @property
    def costs(self) -> CostModel | None:
        """The planner's decode costs as they stand (adaptive modes), else None."""
        return costs_of(self.drafter)

    def remember_costs(self) -> None:
        """The next command on this pair starts from what this one measured."""
        costs = self.costs
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
    loaded = LoadedPair(load_models(request, loader), request)
    try:
        yield loaded
    finally:
        loaded.remember_costs()
