"""The `specdec models` listing: each registry model, where its file is, what it drafts for.

A model drafts for the larger registry models of the same vocabulary (vocab.py); a drafter
also drafts by text for larger targets of another vocabulary. Nothing is downloaded here:
a model not on disk has no path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .fetch import find_local
from .registry import ModelEntry, Registry
from .vocab import entry_fingerprint


@dataclass(frozen=True)
class ModelStatus:
    """One row of `specdec models`."""

    name: str
    aliases: tuple[str, ...]
    role: str | None
    family: str
    params: str | None
    quant: str | None
    size: int | None
    path: Path | None  # None when not downloaded
    vocab: str | None
    drafter_for: tuple[str, ...]  # larger registry models with the same vocabulary
    # larger registry targets of another vocabulary, which it drafts for by text
    text_drafter_for: tuple[str, ...] = ()

    @property
    def downloaded(self) -> bool:
        return self.path is not None

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(
            path=str(self.path) if self.path else None,
            downloaded=self.downloaded,
            aliases=list(self.aliases),
            drafter_for=list(self.drafter_for),
            text_drafter_for=list(self.text_drafter_for),
        )
        return data


def model_statuses(registry: Registry) -> list[ModelStatus]:
    """Every registry model with its local state and the targets it can draft for."""
    entries = sorted(registry.models.values(), key=lambda e: (e.family, e.param_count))
    vocab = {e.name: entry_fingerprint(e) for e in entries}
    return [_status(e, registry, vocab, entries) for e in entries]


def _status(entry: ModelEntry, registry: Registry, vocab: dict, entries: list) -> ModelStatus:
    mine = vocab[entry.name]
    larger = [other for other in entries if other.param_count > entry.param_count]
    targets = tuple(other.name for other in larger if mine and vocab[other.name] == mine)
    by_text = tuple(
        other.name
        for other in larger
        if mine
        and vocab[other.name] not in (None, mine)
        and entry.role == "drafter"
        and other.role == "target"
    )
    path = find_local(entry)
    return ModelStatus(
        name=entry.name,
        aliases=tuple(registry.aliases_of(entry.name)),
        role=entry.role,
        family=entry.family,
        params=entry.params,
        quant=entry.quant,
        # A copy made here (requantised) has no size in the registry until it exists.
        size=entry.size or (path.stat().st_size if path else None),
        path=path,
        vocab=mine,
        drafter_for=targets,
        text_drafter_for=by_text,
    )
