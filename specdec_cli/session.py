"""Turning options into loaded models and prompt tokens: the steps every command shares."""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .adaptive import CostModel, build_drafter
from .backend import Backend, encode_chat
from .compat import check_compatible
from .drafters import Drafter
from .engine import GenerationSettings, SamplingRule
from .errors import BadUsageError, ContextOverflowError
from .history import HistoryFile, HistoryIndex
from .json_cache import read_json_cache, update_json_cache
from .paths import cache_dir
from .sampling import SamplingSettings


@dataclass(frozen=True)
class HardwareOptions:
    ctx_size: int | None = None  # None: as much as the text needs (see fit_context)
    threads: int | None = None
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    verbose: bool = False
    exact: bool = True  # the target decodes small batches with batch-invariant kernels
    rpc: tuple[str, ...] = ()  # workers holding the target's layers (llama.cpp's RPC backend)
    tensor_split: tuple[float, ...] = ()  # each worker's share of them

    def placement(self) -> str:
        """Where the models run, for keying what depends on it (decode costs, saved states)."""
        text = f"threads={self.threads}:ngl={self.gpu_layers}:{self.draft_gpu_layers}"
        if self.rpc:
            text += f":rpc={','.join(self.rpc)}:split={','.join(map(str, self.tensor_split))}"
        return text


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
    rule: SamplingRule = SamplingRule.INVARIANT

    @property
    def drafter_label(self) -> str | None:
        """Who drafts, for chat's header and serve's banner: None for the target alone."""
        if self.drafter_mode == "none":
            return None
        if self.draft is None:
            return "prompt lookup"
        return f"{self.draft.stem} ({self.drafter_mode})"

    def generation_settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=self.max_tokens,
            draft_max=self.draft_max,
            stop=self.stop,
            sampling=self.sampling,
            seed=self.seed,
            rule=self.rule,
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
            "rule": self.rule.value,
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

    def backends(self) -> list[Backend]:
        others = [backend for backend, _ in self.alternates.values()]
        return [b for b in (self.target, self.drafter, *others) if b is not None]

    def reset(self) -> None:
        for backend in self.backends():
            backend.truncate(0)

    def close(self) -> None:
        for backend in self.backends():
            backend.close()


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
        n_ctx=hardware.ctx_size or MIN_CONTEXT,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.gpu_layers,
        exact=hardware.exact,
        workers=hardware.rpc,
        tensor_split=hardware.tensor_split,
    )
    pair = ModelPair(target, None)
    fit_context(pair, hardware, MIN_CONTEXT)  # only a model trained on less changes
    if draft_path is not None:
        pair.drafter = load_drafter(target, draft_path, hardware, force_incompatible)
    return pair


def load_models(request: DecodeRequest) -> ModelPair:
    return load_pair(request.target, request.draft, request.hardware, request.force_incompatible)


def drafter_for(request: DecodeRequest, pair: ModelPair) -> Drafter | None:
    """The drafter the request's mode asks for, timed on this machine."""
    if request.drafter_mode == "none":
        return None
    costs = pair_costs(pair, request.hardware)
    return build_drafter(request.drafter_mode, pair.target, pair.drafter, costs=costs)


MIN_CONTEXT = 1024
CHAT_CONTEXT = 4096  # a conversation grows: room for several exchanges
CONTEXT_STEP = 256  # llama.cpp pads contexts to this


def fit_context(pair: ModelPair, hardware: HardwareOptions, needed: int) -> None:
    """Unless --ctx-size was given, contexts of `needed` tokens: rounded up, at least
    MIN_CONTEXT, but never longer than the target was trained for."""
    if hardware.ctx_size is not None:
        return
    n_ctx = context_size(needed, pair.target.n_ctx_train)
    for backend in pair.backends():
        if backend.n_ctx != n_ctx:
            backend.resize_context(n_ctx)


def context_size(needed: int, trained: int) -> int:
    rounded = -(-max(needed, MIN_CONTEXT) // CONTEXT_STEP) * CONTEXT_STEP
    return min(rounded, trained) if trained > 0 else rounded


def load_drafter(
    target: Backend, draft_path: Path, hardware: HardwareOptions, force_incompatible: bool = False
) -> Backend:
    from . import llama_backend

    drafter = llama_backend.LlamaBackend(
        draft_path,
        n_ctx=target.n_ctx,  # the drafter follows the target through the same text
        n_threads=hardware.threads,
        n_gpu_layers=hardware.draft_gpu_layers,
        local_only=bool(hardware.rpc),  # the drafter's passes cost no round trips
    )
    if not force_incompatible:
        check_compatible(target, drafter)
    return drafter


def load_history(folder: Path, target: Path) -> tuple[HistoryFile, HistoryIndex, int]:
    """The --history file for a target (one per vocabulary, see HistoryFile), its index, and
    how many damaged lines were skipped."""
    from .fetch import FINGERPRINT_CHARS, fingerprints

    file = HistoryFile(folder, fingerprints().fingerprint(target)[:FINGERPRINT_CHARS])
    index, damaged = file.load()
    return file, index, damaged


def chat_messages(user_text: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user_text}]


def prompt_tokens(target: Backend, text: str, *, system: str | None, raw: bool) -> list[int]:
    """Raw text as-is (with the model's BOS), or the user message through the chat template."""
    if raw:
        return target.tokenize(text, add_special=True)
    return encode_chat(target, chat_messages(text, system))


def read_prediction(path: Path) -> str:
    """The text of a --predict or /predict file: what the answer is expected to repeat."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise BadUsageError(
            f"cannot read the prediction {path}: {reason or error}.",
            "Pass a readable text file: the text the answer is expected to mostly repeat.",
        ) from None
    if not text.strip():
        raise BadUsageError(f"the prediction {path} is empty.", "Pass a file with text in it.")
    return text


def prediction_tokens(target: Backend, text: str | None) -> tuple[int, ...]:
    return tuple(target.tokenize(text, add_special=False)) if text else ()


def check_prompt_fits(prompt: list[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}.",
            "Raise --ctx-size or shorten the input.",
        )


COSTS_MAX_AGE_SECONDS = 24 * 3600
# A run writes back what it learned only after this many timed decodes: fewer say little.
COSTS_MIN_DECODES = 16


def costs_cache() -> Path:
    return cache_dir() / "decode-costs.json"


def pair_costs(pair: ModelPair, hardware: HardwareOptions, kernels: str | None = None) -> CostModel:
    """Decode timings of this pair on this machine, as the last run left them (cached, for a
    day since that run), else probed (a few seconds). A probe is cached only if it passes
    its checks (adaptive.probe_problems); either way the run corrects its own copy with
    every decode, and `remember_costs` writes the corrected table back."""
    from .adaptive import measure_pair_costs

    cache = costs_cache()
    key = costs_key(pair, hardware, kernels)
    cached = _cached_costs(read_json_cache(cache).get(key)) if key else None
    if cached is not None:
        return cached
    costs = measure_pair_costs(pair.target, pair.drafter)
    if key and costs.trusted:
        entry = _cost_entry(costs)
        costs.started_at = entry["measured_at"]  # a later entry is another process's
        update_json_cache(cache, lambda entries: entries.update({key: entry}))
    return costs


def remember_costs(
    pair: ModelPair, hardware: HardwareOptions, costs: CostModel, kernels: str | None = None
) -> None:
    """Write the table a run ended with back to the cache, so the next run starts from it.
    Merged under the cache's lock: another process's keys stay, and if it wrote this key
    since this run read it, each cost is the mean of both (both measured this machine now).
    A table that fails the shape checks, or a run that timed few decodes, is not written."""
    from .adaptive import table_problems

    key = costs_key(pair, hardware, kernels)
    if not key or not costs.learn or costs.decodes_observed < COSTS_MIN_DECODES:
        return
    healed = costs.healed()
    if table_problems(healed.verify_seconds):
        return
    entry = _cost_entry(healed)

    def merge(entries: dict) -> None:
        theirs = _cached_costs(entries.get(key))
        if theirs is not None and entries[key]["measured_at"] > costs.started_at:
            for n, seconds in theirs.verify_seconds.items():
                if str(n) in entry["verify_seconds"]:
                    entry["verify_seconds"][str(n)] = (
                        entry["verify_seconds"][str(n)] + seconds
                    ) / 2
            entry["draft_step"] = (entry["draft_step"] + theirs.draft_step) / 2
        entries[key] = entry

    update_json_cache(costs_cache(), merge)


def _cost_entry(costs: CostModel) -> dict:
    return {
        "measured_at": time.time(),
        "verify_seconds": {str(n): s for n, s in sorted(costs.verify_seconds.items())},
        "draft_step": costs.draft_step,
        "origin": costs.origin,
    }


def _cached_costs(entry: object) -> CostModel | None:
    """A cache entry as a starting table; None if it is missing, old or malformed."""
    if not isinstance(entry, dict):
        return None
    try:
        measured_at = float(entry["measured_at"])
        if time.time() - measured_at >= COSTS_MAX_AGE_SECONDS:
            return None
        table = {int(n): float(s) for n, s in entry["verify_seconds"].items()}
        step = float(entry["draft_step"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not table or min(table.values()) <= 0 or step < 0:
        return None
    origin = f"cache ({entry.get('origin', 'probe')})"
    return CostModel(table, step, origin=origin, started_at=measured_at)


def prompt_cache_key(pair: ModelPair, hardware: HardwareOptions) -> str:
    """What a saved KV state depends on: each model file's content, the kernels (exact or
    fast, and the build), threads and GPU layers."""
    from . import llama_backend
    from .fetch import cached_sha256

    files = [cached_sha256(b.path) if b and b.path else "-" for b in (pair.target, pair.drafter)]
    setup = f"{hardware.placement()}:{llama_backend.kernel_signature(hardware.exact)}"
    return hashlib.sha256("|".join([*files, setup]).encode()).hexdigest()


def costs_key(pair: ModelPair, hardware: HardwareOptions, kernels: str | None = None) -> str | None:
    """What decode costs depend on: both model files (path, size, time), threads, GPU layers
    and the kernels (exact or fast, and which build: llama_backend.kernel_signature)."""
    parts = []
    for backend in (pair.target, pair.drafter):
        if backend is None:
            parts.append("-")
        elif backend.path is None:
            return None  # not a model file: nothing to recognise it by next time
        else:
            stat = backend.path.stat()
            parts.append(f"{backend.path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}")
    if kernels is None:
        from . import llama_backend

        kernels = llama_backend.kernel_signature(hardware.exact)
    parts.append(f"{hardware.placement()}:exact={hardware.exact}:{kernels}")
    return "|".join(parts)
