"""Turning options into loaded models and prompt tokens: the steps every command shares."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .adaptive import CostModel, build_drafter
from .backend import Backend
from .compat import check_compatible
from .drafters import Drafter
from .engine import GenerationSettings
from .errors import ContextOverflowError
from .sampling import SamplingSettings


@dataclass(frozen=True)
class HardwareOptions:
    ctx_size: int = 4096
    threads: int | None = None
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    verbose: bool = False


@dataclass(frozen=True)
class DecodeRequest:
    """What `run` and `chat` share: which models, how to draft, how to sample."""

    target: Path
    draft: Path | None
    drafter_mode: str  # see adaptive.build_drafter; "none" for the target alone
    system: str | None
    sampling: SamplingSettings
    seed: int | None
    max_tokens: int
    stop: tuple[str, ...]
    draft_max: int
    hardware: HardwareOptions
    force_incompatible: bool = False

    def generation_settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=self.max_tokens,
            draft_max=self.draft_max,
            stop=self.stop,
            sampling=self.sampling,
            seed=self.seed,
        )

    def record(self) -> dict:
        return {
            "target": str(self.target),
            "draft": None if self.draft is None else str(self.draft),
            "drafter": self.drafter_mode,
            "sampling": asdict(self.sampling),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "draft_max": self.draft_max,
            "system": self.system,
            "hardware": asdict(self.hardware),
        }


@dataclass
class ModelPair:
    target: Backend
    drafter: Backend | None
    costs: CostModel | None = None  # decode timings on this machine, once measured
    # More drafters to compare (bench): name -> (backend, its costs once measured)
    alternates: dict[str, tuple[Backend, CostModel | None]] = field(default_factory=dict)

    def reset(self) -> None:
        others = [backend for backend, _ in self.alternates.values()]
        for backend in (self.target, self.drafter, *others):
            if backend is not None:
                backend.truncate(0)


def load_pair(
    target_path: Path,
    draft_path: Path | None,
    hardware: HardwareOptions,
    force_incompatible: bool = False,
) -> ModelPair:
    from . import llama_backend  # imported late: loading llama.cpp takes a moment

    llama_backend.set_verbose(hardware.verbose)
    target = llama_backend.LlamaBackend(
        target_path,
        n_ctx=hardware.ctx_size,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.gpu_layers,
    )
    if draft_path is None:
        return ModelPair(target, None)
    return ModelPair(target, load_drafter(target, draft_path, hardware, force_incompatible))


def open_models(request: DecodeRequest) -> tuple[ModelPair, Drafter | None]:
    """Load the pair and build the drafter its mode asks for."""
    pair = load_pair(request.target, request.draft, request.hardware, request.force_incompatible)
    if request.drafter_mode == "none":
        return pair, None
    costs = pair_costs(pair, request.hardware)
    return pair, build_drafter(request.drafter_mode, pair.target, pair.drafter, costs=costs)


def load_drafter(
    target: Backend, draft_path: Path, hardware: HardwareOptions, force_incompatible: bool = False
) -> Backend:
    from . import llama_backend

    drafter = llama_backend.LlamaBackend(
        draft_path,
        n_ctx=hardware.ctx_size,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.draft_gpu_layers,
    )
    if not force_incompatible:
        check_compatible(target, drafter)
    return drafter


def chat_messages(user_text: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user_text}]


def prompt_tokens(target, text: str, *, system: str | None, raw: bool) -> list[int]:
    """Raw text as-is (with the model's BOS), or the user message through the chat template."""
    if raw:
        return target.tokenize(text, add_special=True)
    return chat_tokens(target, chat_messages(text, system))


def chat_tokens(target, messages: list[dict[str, str]]) -> list[int]:
    """Messages through the target's chat template, its special tokens read as such."""
    rendered = target.format_chat(messages)
    return target.tokenize(rendered, add_special=False, parse_special=True)


def check_prompt_fits(prompt: list[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}.",
            "Raise --ctx-size or shorten the input.",
        )


COSTS_MAX_AGE_SECONDS = 24 * 3600


def pair_costs(pair: ModelPair, hardware: HardwareOptions) -> CostModel:
    """Decode timings of this pair on this machine: measured once (a few seconds), then
    reused from a small cache for a day. Each run refines its own copy as it goes."""
    from .adaptive import measure_pair_costs
    from .fetch import specdec_cache_dir

    cache = specdec_cache_dir() / "decode-costs.json"
    key = _costs_key(pair, hardware)
    entries = _read_json(cache)
    entry = entries.get(key) if key else None
    if entry and time.time() - entry["measured_at"] < COSTS_MAX_AGE_SECONDS:
        table = {int(n): seconds for n, seconds in entry["verify_seconds"].items()}
        return CostModel(table, entry["draft_step"])
    costs = measure_pair_costs(pair.target, pair.drafter)
    if key:
        entries[key] = {
            "measured_at": time.time(),
            "verify_seconds": {str(n): s for n, s in costs.verify_seconds.items()},
            "draft_step": costs.draft_step,
        }
        _write_json_atomically(cache, entries)
    return costs


def _costs_key(pair: ModelPair, hardware: HardwareOptions) -> str | None:
    parts = []
    for backend in (pair.target, pair.drafter):
        path = getattr(backend, "path", None)
        if backend is not None and path is None:
            return None
        if path is not None:
            stat = Path(path).stat()
            parts.append(f"{Path(path).resolve()}:{stat.st_size}:{int(stat.st_mtime)}")
        else:
            parts.append("-")
    parts.append(
        f"threads={hardware.threads}:ngl={hardware.gpu_layers}:{hardware.draft_gpu_layers}"
    )
    return "|".join(parts)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a missing or damaged cache is only a cache: measure again


def _write_json_atomically(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=1))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only home: the next run measures again
