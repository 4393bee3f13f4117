"""What a bench measures: the request every side shares, and bench's own settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..request import DecodeRequest
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
