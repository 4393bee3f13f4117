"""Bench requests for tests, built as `specdec bench` builds them."""

from __future__ import annotations

from pathlib import Path

from specdec_cli.bench.bench_configs import Configuration
from specdec_cli.bench.bench_prompts import BenchPrompt
from specdec_cli.bench.bench_request import BenchRequest, shared_request
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.decoding.verification import SamplingRule
from specdec_cli.request import HardwareOptions


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
    decode = shared_request(
        Path(target),
        None if draft is None else Path(draft),
        hardware=hardware,
        sampling=sampling or SamplingSettings(),
        rule=rule,
    )
    return BenchRequest(decode, prompts, configurations, **bench_fields)
