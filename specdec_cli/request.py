"""What a command asks for: which models, how to draft and sample, on what hardware."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .decoding.engine import GenerationSettings
from .decoding.modes import DrafterMode
from .decoding.penalties import Penalties
from .decoding.sampling import SamplingSettings
from .decoding.verification import SamplingRule
from .structured import Structure


@dataclass(frozen=True, kw_only=True)  # by name only: two swapped ints would pass
class HardwareOptions:
    ctx_size: int | None = None  # None: as much as the text needs (see fit_context)
    threads: int | None = None
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    verbose: bool = False
    exact: bool = True  # the target decodes small batches with batch-invariant kernels
    rpc: tuple[str, ...] = ()  # workers holding the target's layers (llama.cpp's RPC backend)
    tensor_split: tuple[float, ...] = ()  # each worker's share of them
    # Every decode on one thread of its own (serve: its slots' threads, and a probe at start,
    # would each get a team of llama.cpp's OpenMP threads; see llama/library._DecodeThread).
    one_decode_thread: bool = False

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
    drafter_mode: DrafterMode  # see adaptive.build_drafter; NONE: the target alone
    system: str | None
    sampling: SamplingSettings
    seed: int | None
    max_tokens: int
    stop: tuple[str, ...]
    draft_max: int
    hardware: HardwareOptions
    force_incompatible: bool = False
    rule: SamplingRule = SamplingRule.INVARIANT
    structure: Structure | None = None  # --json-schema, --grammar: what the answer must be
    penalties: Penalties = Penalties()  # --frequency-penalty, --presence-penalty

    @property
    def drafter_label(self) -> str | None:
        """Who drafts, for chat's header and serve's banner: None for the target alone."""
        if self.drafter_mode == DrafterMode.NONE:
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
            structure=self.structure,
            penalties=self.penalties,
        )

    def record(self) -> dict:
        return {
            "target": str(self.target),
            "draft": None if self.draft is None else str(self.draft),
            "drafter": str(self.drafter_mode),
            "sampling": asdict(self.sampling),
            "penalties": asdict(self.penalties),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "draft_max": self.draft_max,
            "rule": self.rule.value,
            "structure": None if self.structure is None else self.structure.kind.value,
            "system": self.system,
            "hardware": asdict(self.hardware),
        }
