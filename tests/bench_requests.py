"""Bench requests for tests, built as `specdec bench` builds them."""

from __future__ import annotations

from pathlib import Path

from specdec_cli.bench.bench_configs import Configuration
from specdec_cli.bench.bench_prompts import BenchPrompt
from specdec_cli.bench.bench_request import BenchRequest
from specdec_cli.decoding.modes import DrafterMode
from specdec_cli.decoding.policy import ADAPTIVE_DRAFT_LIMIT
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.decoding.verification import SamplingRule
from specdec_cli.request import DecodeRequest, HardwareOptions


def bench_request(
    target: Path,
    draft: Path | None,
    prompts: list[BenchPrompt],
    configurations: list[Configuration],
    *,
    hardware: HardwareOptions,
    sampling: SamplingSettings | None = None,
    rule: SamplingRule = SamplingRule.INVARIANT,
    **bench_fields,
) -> BenchRequest:
    decode = DecodeRequest(
        target=Path(target),
        draft=None if draft is None else Path(draft),
        drafter_mode=DrafterMode.NONE,
        system=None,
        sampling=sampling or SamplingSettings(),
        seed=0,
        max_tokens=0,
        stop=(),
        draft_max=ADAPTIVE_DRAFT_LIMIT,
        hardware=hardware,
        rule=rule,
    )
    return BenchRequest(decode, prompts, configurations, **bench_fields)
