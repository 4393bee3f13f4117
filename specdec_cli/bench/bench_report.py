"""Bench results: runs, their aggregates, the report and its JSON (the statistics are
bench_stats.py's, the machine and model records bench_machine.py's)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..decoding.comparison import Comparison
from ..decoding.engine import (
    FinishReason,
    GenerationStats,
)
from ..errors import BadUsageError
from .bench_configs import INSTRUMENTS, ORACLE, TARGET_ALONE, Configuration
from .bench_machine import timestamp
from .bench_prompts import BenchPrompt
from .bench_stats import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, Estimate, speedup_estimate

SCHEMA = "specdec.bench/1"
METHOD = {
    "interleaving": "per prompt and repeat: target alone, then each configuration in order",
    "cache": "every run starts from an empty KV cache (prompt processing included), but a "
    "warm prompt's from what its session's previous request, run untimed on the same side, "
    "left (as a server keeps it)",
    "tokens_per_second": "generated tokens / wall seconds from the first decode to the last "
    "token; per prompt the median over repeats",
    "speedup": "per repeat: configuration tokens/s / target-alone tokens/s of the same repeat; "
    "per prompt the median over repeats; per category and suite the geometric mean of the "
    "per-prompt medians",
    "confidence_interval": f"95% percentile bootstrap, repeats resampled within each prompt, "
    f"{BOOTSTRAP_DRAWS} draws, seed {BOOTSTRAP_SEED}",
    "counts": "drafted, accepted, generated tokens, target passes and seconds are sums over "
    "the runs in scope; acceptance = accepted / drafted; "
    "tokens_per_pass = (generated + end_tokens) / passes (end_tokens: end-of-generation "
    "tokens a pass chose, not in the text; the target alone makes 1.0)",
    "identical": "greedy runs only: the first repeat's tokens against the target alone's",
}


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


@dataclass(frozen=True)
class RunRecord:
    prompt_id: str
    category: str
    side: str  # TARGET_ALONE or a configuration label
    repeat: int
    seed: int
    tokens: list[int]
    text: str
    finish_reason: FinishReason
    stats: GenerationStats
    valid: bool | None = None  # a structured prompt's answer parses and matches (None: free)
    decode_seconds: float = 0.0  # of its seconds, the models' decodes'

    def as_dict(self) -> dict:
        return {
            "prompt": self.prompt_id,
            "category": self.category,
            "side": self.side,
            "repeat": self.repeat,
            "seed": self.seed,
            "finish_reason": self.finish_reason,
            "text": self.text,
            "valid": self.valid,
            **self.stats.as_dict(),
            "decode_seconds": _round(self.decode_seconds, 4),
        }


@dataclass(frozen=True)
class Aggregate:
    """One side (target alone or a configuration) over the runs of a scope."""

    runs: int
    generated: int
    seconds: float
    tokens_per_second: float | None  # median over runs
    first_token_seconds: float | None  # median over runs
    drafted: int
    accepted: int
    target_passes: int
    draft_seconds: float
    verify_seconds: float
    draft_lengths: dict[str, int]
    draft_sources: dict[str, int]
    end_tokens: int = 0  # end-of-generation tokens chosen by a pass (not in the text)
    decode_seconds: float = 0.0  # the models' decodes, logits back on the host included

    @classmethod
    def of(cls, records: Sequence[RunRecord]) -> Aggregate:
        stats = [r.stats for r in records]
        total = GenerationStats()
        for s in stats:
            total.merge(s)
        first = [s.first_token_seconds for s in stats if s.first_token_seconds is not None]
        return cls(
            runs=len(stats),
            generated=total.generated,
            seconds=total.seconds,
            tokens_per_second=_median([s.tokens_per_second for s in stats]),
            first_token_seconds=_median(first),
            drafted=total.drafted,
            accepted=total.accepted,
            target_passes=total.target_passes,
            draft_seconds=total.draft_seconds,
            verify_seconds=total.verify_seconds,
            draft_lengths={str(k): v for k, v in sorted(total.draft_lengths.items())},
            draft_sources=dict(total.draft_sources),
            end_tokens=total.end_tokens,
            decode_seconds=sum(r.decode_seconds for r in records),
        )

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        # as GenerationStats counts it: the target alone makes exactly 1.0
        decided = self.generated + self.end_tokens
        return decided / self.target_passes if self.target_passes else None

    @property
    def other_seconds(self) -> float:
        """Time neither drafting nor verifying: Python, sampling, detokenising."""
        return max(0.0, self.seconds - self.draft_seconds - self.verify_seconds)

    @property
    def host_share(self) -> float | None:
        """The share of the time spent outside the models' decodes: specdec's own work
        (planning, comparing, argmax, text) and Python's. A GPU's step is short enough for it
        to matter (docs/gpus.md)."""
        if self.seconds <= 0:
            return None
        return max(0.0, 1.0 - self.decode_seconds / self.seconds)

    def time_split(self) -> dict[str, float] | None:
        if self.seconds <= 0:
            return None
        return {
            "draft": round(self.draft_seconds / self.seconds, 4),
            "verify": round(self.verify_seconds / self.seconds, 4),
            "other": round(self.other_seconds / self.seconds, 4),
        }

    def as_dict(self) -> dict:
        return {
            "runs": self.runs,
            "generated_tokens": self.generated,
            "seconds": _round(self.seconds, 4),
            "tokens_per_second": _round(self.tokens_per_second, 3),
            "first_token_seconds": _round(self.first_token_seconds, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": _round(self.acceptance, 4),
            "target_passes": self.target_passes,
            "end_tokens": self.end_tokens,
            "tokens_per_pass": _round(self.tokens_per_pass, 4),
            "draft_seconds": _round(self.draft_seconds, 4),
            "verify_seconds": _round(self.verify_seconds, 4),
            "other_seconds": _round(self.other_seconds, 4),
            "time_split": self.time_split(),
            "decode_seconds": _round(self.decode_seconds, 4),
            "host_share": _round(self.host_share, 4),
            "draft_lengths": self.draft_lengths,
            "draft_sources": self.draft_sources,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class OutputCheck:
    """Is the configuration's output the target's own? (greedy or invariant-rule runs)"""

    comparison: Comparison  # first repeat against the reference's first repeat
    identical_repeats: int
    repeats: int
    reference: str = TARGET_ALONE  # whose answer it must be: the target alone, same kernels

    def as_dict(self) -> dict:
        return {
            **self.comparison.as_dict(),
            "identical_repeats": self.identical_repeats,
            "repeats_compared": self.repeats,
            "reference": self.reference,
        }


@dataclass(frozen=True)
class Row:
    """One configuration against the target alone over a scope: a prompt, a category, or
    the whole suite."""

    scope: str  # "prompt", "category" or "suite"
    name: str  # the prompt id, the category, or "suite"
    category: str | None
    configuration: str
    alone: Aggregate
    speculative: Aggregate
    speedup: Estimate | None
    prompts: int  # prompts with at least one paired repeat
    identical_prompts: int  # among those compared
    compared_prompts: int
    check: OutputCheck | None = None  # prompt rows only
    prompt_tokens: int | None = None  # prompt rows only
    efficiency: float | None = None  # speedup / the oracle's speedup over the same prompts

    def as_dict(self) -> dict:
        record = {
            "efficiency": None if self.efficiency is None else round(self.efficiency, 4),
            "name": self.name,
            "category": self.category,
            "configuration": self.configuration,
            "target_alone": self.alone.as_dict(),
            "speculative": self.speculative.as_dict(),
            "speedup": None if self.speedup is None else self.speedup.as_dict(),
            "prompts": self.prompts,
            "identical_prompts": self.identical_prompts,
            "compared_prompts": self.compared_prompts,
        }
        if self.scope == "prompt":
            record["prompt_tokens"] = self.prompt_tokens
            record["output"] = None if self.check is None else self.check.as_dict()
        return record


@dataclass
class BenchReport:
    """Everything measured, complete or not; the summaries are computed from the runs."""

    settings: dict
    prompts: list[BenchPrompt]
    configurations: list[Configuration]
    repeats: int
    models: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    checks: dict[tuple[str, str], OutputCheck] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: timestamp())
    finished_at: str | None = None
    stopped_by: str | None = None  # "interrupted" or "error: ..." when the run ended early
    exit_code: int = 0
    # The decode costs measured before the runs, and where the runs' own timed decodes
    # (pooled) moved them: CostModel.as_dict.
    costs: dict | None = None
    # In exact mode, the target's decode costs with llama.cpp's own kernels too, measured
    # alongside: why drafts pay in one mode and not the other (CostModel.as_dict).
    costs_fast: dict | None = None

    @property
    def sides(self) -> list[str]:
        return [TARGET_ALONE, *(c.label for c in self.configurations)]

    def planned(self) -> list[tuple[str, str, int]]:
        return [
            (p.id, side, r)
            for p in self.prompts
            for r in range(self.repeats)
            for side in self.sides
        ]

    def missing(self) -> list[tuple[str, str, int]]:
        done = {(r.prompt_id, r.side, r.repeat) for r in self.runs}
        return [key for key in self.planned() if key not in done]

    @property
    def complete(self) -> bool:
        return self.stopped_by is None and not self.missing()

    def missing_summary(self) -> str:
        """One line: which prompts were not measured at all, which only in part."""
        missing = self.missing()
        if not missing:
            return ""
        per_prompt = Counter(pid for pid, _, _ in missing)
        whole = [pid for pid, n in per_prompt.items() if n == self.repeats * len(self.sides)]
        partial = [f"{pid} ({n} runs)" for pid, n in per_prompt.items() if pid not in whole]
        parts = []
        if whole:
            parts.append(f"not measured: {', '.join(whole)}")
        if partial:
            parts.append(f"partly measured: {', '.join(partial)}")
        return f"{len(missing)} of {len(self.planned())} runs missing; " + "; ".join(parts)

    # -- summaries ---------------------------------------------------------------------------

    def _runs_of(self, prompt_ids: set[str], side: str) -> list[RunRecord]:
        return [r for r in self.runs if r.prompt_id in prompt_ids and r.side == side]

    def by_repeat(self, prompt_id: str, side: str) -> dict[int, RunRecord]:
        return {r.repeat: r for r in self.runs if r.prompt_id == prompt_id and r.side == side}

    def _ratios(self, prompt_id: str, label: str) -> list[float]:
        """Paired speedups: each repeat's tokens/s over the target alone's in that repeat."""
        alone, spec = self.by_repeat(prompt_id, TARGET_ALONE), self.by_repeat(prompt_id, label)
        pairs = [(spec[r].stats, alone[r].stats) for r in sorted(set(alone) & set(spec))]
        return [
            s.tokens_per_second / a.tokens_per_second
            for s, a in pairs
            if s.tokens_per_second > 0 and a.tokens_per_second > 0
        ]

    def _row(self, scope: str, name: str, category: str | None, ids: list[str], label: str) -> Row:
        groups = [self._ratios(pid, label) for pid in ids]
        checks = [self.checks[(pid, label)] for pid in ids if (pid, label) in self.checks]
        speedup = speedup_estimate(groups)
        return Row(
            scope=scope,
            name=name,
            category=category,
            configuration=label,
            alone=Aggregate.of(self._runs_of(set(ids), TARGET_ALONE)),
            speculative=Aggregate.of(self._runs_of(set(ids), label)),
            speedup=speedup,
            efficiency=self._efficiency(speedup, ids),
            prompts=sum(1 for g in groups if g),
            identical_prompts=sum(1 for c in checks if c.comparison.identical),
            compared_prompts=len(checks),
            check=self.checks.get((ids[0], label)) if scope == "prompt" else None,
            prompt_tokens=self.prompt_tokens.get(ids[0]) if scope == "prompt" else None,
        )

    def _efficiency(self, speedup: Estimate | None, ids: list[str]) -> float | None:
        """A speedup as a fraction of the oracle's over the same prompts: how much of what
        any drafter could get on this machine a configuration gets."""
        if speedup is None or ORACLE not in {c.label for c in self.configurations}:
            return None
        ceiling = speedup_estimate([self._ratios(pid, ORACLE) for pid in ids])
        return None if ceiling is None else speedup.value / ceiling.value

    def _measured_prompts(self) -> list[BenchPrompt]:
        measured = {r.prompt_id for r in self.runs}
        return [p for p in self.prompts if p.id in measured]

    def categories(self) -> list[str]:
        return list(dict.fromkeys(p.category for p in self._measured_prompts()))

    def prompt_rows(self) -> list[Row]:
        return [
            self._row("prompt", p.id, p.category, [p.id], c.label)
            for p in self._measured_prompts()
            for c in self.configurations
        ]

    def category_rows(self) -> list[Row]:
        rows = []
        for category in self.categories():
            ids = [p.id for p in self._measured_prompts() if p.category == category]
            rows += [
                self._row("category", category, category, ids, c.label) for c in self.configurations
            ]
        return rows

    def suite_rows(self) -> list[Row]:
        ids = [p.id for p in self._measured_prompts()]
        if not ids:
            return []
        return [self._row("suite", "suite", None, ids, c.label) for c in self.configurations]

    @staticmethod
    def best(rows: Sequence[Row]) -> dict[str, str]:
        """The configuration with the highest speedup, per row name."""
        best: dict[str, tuple[float, str]] = {}
        for row in rows:
            if row.configuration in INSTRUMENTS:
                continue
            if row.speedup is not None and row.speedup.value > best.get(row.name, (-1.0, ""))[0]:
                best[row.name] = (row.speedup.value, row.configuration)
        return {name: configuration for name, (_, configuration) in best.items()}

    def validity(self) -> dict | None:
        """Structured prompts' answers: how many, and how many parsed and matched."""
        judged = [run.valid for run in self.runs if run.valid is not None]
        return {"answers": len(judged), "valid": sum(judged)} if judged else None

    def as_dict(self) -> dict:
        category_rows, suite_rows = self.category_rows(), self.suite_rows()
        return {
            "schema": SCHEMA,
            "complete": self.complete,
            "stopped_by": self.stopped_by,
            "missing": [
                {"prompt": pid, "side": side, "repeat": repeat}
                for pid, side, repeat in self.missing()
            ],
            "missing_summary": self.missing_summary() or None,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "settings": self.settings,
            "method": METHOD,
            "machine": self.machine,
            "models": self.models,
            "decode_costs": self.costs,
            "decode_costs_fast_kernels": self.costs_fast,
            "summary": {
                "prompts_planned": len(self.prompts),
                "prompts_measured": len(self._measured_prompts()),
                "runs_planned": len(self.planned()),
                "runs_measured": len(self.runs),
                "best_configuration": next(iter(self.best(suite_rows).values()), None),
                "best_per_category": self.best(category_rows),
                "configurations": [row.as_dict() for row in suite_rows],
                "structured": self.validity(),
            },
            "categories": [row.as_dict() for row in category_rows],
            "prompts": [row.as_dict() for row in self.prompt_rows()],
            "runs": [run.as_dict() for run in self.runs],
        }


def check_output_paths(*paths: Path | None) -> None:
    """Each report file can be written where asked ('-' is stdout), before anything runs."""
    for path in paths:
        if path is not None and str(path) != "-" and not path.parent.is_dir():
            raise BadUsageError(
                f"cannot write {path}: {path.parent} is not a folder.",
                "Create it, or write the report somewhere else.",
            )


def write_json(report: BenchReport, path: Path) -> None:
    """To `path`, or stdout for '-'."""
    text = json.dumps(report.as_dict(), indent=1, ensure_ascii=False) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text, encoding="utf-8")
