"""What a command drafts with: the drafter its mode asks for, timed on this machine, and the
--history file it drafts from too."""

from __future__ import annotations

from pathlib import Path

from ..decoding.drafters import Drafter
from ..decoding.history import HistoryIndex
from ..decoding.modes import DrafterMode, build_drafter
from ..models.loading import ModelPair
from ..models.vocab import FINGERPRINT_CHARS, fingerprints
from ..request import DecodeRequest
from .cost_cache import pair_costs
from .history_file import HistoryFile


def drafter_for(request: DecodeRequest, pair: ModelPair) -> Drafter | None:
    """The drafter the request's mode asks for, timed on this machine."""
    if request.drafter_mode == DrafterMode.NONE:
        return None
    costs = pair_costs(pair, request.hardware)
    by_text = pair.drafts_by_text(pair.drafter)
    return build_drafter(request.drafter_mode, pair.target, pair.drafter, costs, by_text)


def load_history(folder: Path, target: Path) -> tuple[HistoryFile, HistoryIndex, int]:
    """The --history file for a target (one per vocabulary, see HistoryFile), its index, and
    how many damaged lines were skipped."""
    file = HistoryFile(folder, fingerprints().fingerprint(target)[:FINGERPRINT_CHARS])
    index, damaged = file.load()
    return file, index, damaged
