"""`specdec pull --optimize-drafter`: a faster copy of a drafter, measured, then recorded.

On a CPU the drafter's cost decides whether model drafting can pay at all. Requantised to
Q4_0, a Q4_K_M/Q5_0 drafter decodes faster; requantising loses a little accuracy, which
costs acceptance. So the copy is built next to the original, both are timed and their
acceptance measured against the target on the same prompts, and the copy is recorded in
the user's models.yaml (where `--target X` without `--draft` will prefer it: same size,
smaller file) only as what it is, with the numbers shown to the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decoding.engine import Generation, GenerationSettings
from ..decoding.modes import measure_pair_costs, model_drafter
from ..models.checksums import sha256_of
from ..models.loading import load_pair
from ..models.pypi import models_dir
from ..models.registry import load_registry, record_user_model
from ..models.resolve import ResolvedModel
from ..request import HardwareOptions
from ..services.prompting import prompt_tokens

PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give a JSON object describing a book with title, author and year.",
    "Explain in two sentences what a mutex is.",
)
TOKENS_PER_PROMPT = 48
DRAFT_LENGTH = 4


@dataclass(frozen=True)
class DrafterMeasurement:
    path: Path
    step_ms: float
    acceptance: float


@dataclass(frozen=True)
class Optimisation:
    name: str
    original: DrafterMeasurement
    optimised: DrafterMeasurement


def optimise_drafter(
    drafter: ResolvedModel,
    target: ResolvedModel,
    hardware: HardwareOptions,
    models_file: Path | None = None,
    quant: str = "q4_0",
) -> Optimisation:
    """Build, measure and record the requantised copy (in `models_file` when given, else in
    the user's models.yaml)."""
    from ..llama.model_file import requantize

    name = f"{drafter.name}-{quant}"
    destination = models_dir() / f"{name}.gguf"
    if not destination.is_file():
        destination.parent.mkdir(parents=True, exist_ok=True)
        requantize(drafter.path, destination, quant, hardware.threads)
    measured = []
    for path in (drafter.path, destination):
        pair = load_pair(target.path, path, hardware)
        by_text = pair.drafts_by_text(pair.drafter)
        step = measure_pair_costs(pair.target, pair.drafter, by_text).draft_step
        measured.append(DrafterMeasurement(path, 1000 * step, _acceptance(pair)))
        pair.close()
    _record(name, drafter, destination, quant, models_file)
    return Optimisation(name, measured[0], measured[1])


def _acceptance(pair) -> float:
    """Greedy acceptance of fixed-length drafts over the probe prompts."""
    drafted = accepted = 0
    settings = GenerationSettings(max_tokens=TOKENS_PER_PROMPT, draft_max=DRAFT_LENGTH)
    for text in PROMPTS:
        pair.reset()
        prompt = prompt_tokens(pair.target, text, system=None, raw=False)
        drafter = model_drafter(pair.target, pair.drafter, pair.drafts_by_text(pair.drafter))
        generation = Generation(pair.target, prompt, settings, drafter)
        finished = generation.run()
        drafted += finished.stats.drafted
        accepted += finished.stats.accepted
    return accepted / drafted if drafted else 0.0


def _record(
    name: str, drafter: ResolvedModel, path: Path, quant: str, models_file: Path | None
) -> None:
    entry = drafter.entry
    fields = {
        "family": entry.family if entry else "unknown",
        "role": "drafter",
        "quant": quant.upper(),
        "size": path.stat().st_size,
        "sha256": sha256_of(path),
        "description": f"{drafter.name} requantised to {quant.upper()} by specdec",
        "sources": [{"path": str(path)}],
    }
    if entry is not None:
        for key in ("params", "context", "vocab"):
            value = getattr(entry, key, None)
            if value:
                fields[key] = value
    originals = load_registry(models_file).aliases_of(drafter.name) if entry is not None else []
    aliases = tuple(f"{alias}-{quant}" for alias in originals)
    record_user_model(name, fields, aliases, models_file)
