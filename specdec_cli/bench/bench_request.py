"""What a bench measures: the request every side shares, and bench's own settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..decoding.modes import DrafterMode
from ..decoding.policy import ADAPTIVE_DRAFT_LIMIT
from ..decoding.sampling import SamplingSettings
from ..decoding.verification import SamplingRule
from ..request import DecodeRequest, HardwareOptions
from .bench_configs import Configuration
from .bench_prompts import BenchPrompt


@dataclass(frozen=True)
class BenchRequest:
    """`decode`: the models, sampling, seed (repeat 0's), rule, system message and hardware
    every side shares, loaded through the commands' one pair lifecycle. Its drafter_mode is
    NONE (each configuration makes its own drafter, fresh for every run) and its max_tokens
    caps every prompt's own (0: no cap). The rest is bench's own."""

    decode: DecodeRequest
    prompts: list[BenchPrompt]
    configurations: list[Configuration]
    extra_drafts: dict[str, Path] = field(default_factory=dict)  # compared in the same run
    prompts_source: str = "built-in suite"
    repeats: int = 3
    warmup_tokens: int = 16
    raw: bool = False

    def seed(self, repeat: int) -> int:
        """Both sides of a repeat sample with its seed: repeat 0's, then one more each."""
        return (self.decode.seed or 0) + repeat

    def max_tokens_for(self, prompt: BenchPrompt) -> int:
        return min(prompt.max_tokens, self.decode.max_tokens or prompt.max_tokens)

    def settings_record(self) -> dict:
        decode = self.decode
        return {
            "target": str(decode.target),
            "draft": None if decode.draft is None else str(decode.draft),
            "extra_drafts": {name: str(path) for name, path in self.extra_drafts.items()},
            "prompts": self.prompts_source,
            "prompt_ids": [p.id for p in self.prompts],
            "configurations": [c.as_dict() for c in self.configurations],
            "repeats": self.repeats,
            "warmup_tokens": self.warmup_tokens,
            "max_tokens": decode.max_tokens or None,
            "sampling": asdict(decode.sampling),
            "seed": decode.seed,
            "rule": decode.rule.value,
            "raw": self.raw,
            "system": decode.system,
            "hardware": asdict(decode.hardware),
        }


def shared_request(
    target: Path,
    draft: Path | None,
    *,
    hardware: HardwareOptions,
    sampling: SamplingSettings,
    seed: int = 0,
    max_tokens: int | None = None,
    system: str | None = None,
    force_incompatible: bool = False,
    rule: SamplingRule = SamplingRule.INVARIANT,
) -> DecodeRequest:
    """The DecodeRequest every side of a bench shares (see BenchRequest): no drafter of its
    own, no stop strings; `max_tokens` caps every prompt's own (None: no cap)."""
    return DecodeRequest(
        target=target,
        draft=draft,
        drafter_mode=DrafterMode.NONE,  # each configuration makes its own drafter
        system=system,
        sampling=sampling,
        seed=seed,
        max_tokens=max_tokens or 0,
        stop=(),
        draft_max=ADAPTIVE_DRAFT_LIMIT,  # each configuration has its own
        hardware=hardware,
        force_incompatible=force_incompatible,
        rule=rule,
    )
