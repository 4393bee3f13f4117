"""`specdec bench`: the target alone against speculative configurations, measured honestly.

Pure measurement and statistics; nothing here imports Rich (render_bench.py draws it).

Method, per prompt: after one short warm-up of every side, each repeat runs the target alone
(the plain one-token-per-decode path, drafter=None) and then every configuration, interleaved
(A B C A B C ...), on the same loaded models. Every run starts from an empty KV cache, so
each pays its own prompt processing, as a user's run would. Speedup is paired: a
configuration's tokens/s over the target alone's in the same repeat.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from .adaptive import (
    ADAPTIVE_DRAFT_LIMIT,
    DRAFTER_MODES,
    NEEDS_DRAFT_MODEL,
    CostModel,
    build_drafter,
    costs_of,
    default_draft_max,
    measure_pair_costs,
    use_history,
)
from .backend import Backend, SwitchableKernels, encode_chat
from .comparison import Comparison, compare_outputs
from .drafters import Draft, Drafter, Outcome, ngram_draft
from .engine import (
    Finished,
    FinishReason,
    Generation,
    GenerationSettings,
    GenerationStats,
    Piece,
    SamplingRule,
)
from .errors import EXIT_INTERRUPTED, BadUsageError, SpecdecError
from .history import HistoryIndex
from .loading import ModelPair, fit_context, load_drafter, load_pair
from .prompting import check_prompt_fits, prediction_tokens, prompt_tokens
from .request import HardwareOptions
from .sampling import SamplingSettings, TokenChooser

SCHEMA = "specdec.bench/1"
TARGET_ALONE = "target alone"  # always llama.cpp's default kernels: the speed to beat
EXACT_ALONE = "target alone, exact"  # batch-invariant kernels: the answer exact mode keeps
ORACLE = "oracle"  # a drafting mode only bench offers: drafts the target alone's own answer
BENCH_MODES = (*DRAFTER_MODES, ORACLE)
INSTRUMENTS = (EXACT_ALONE, ORACLE)  # measured for reference, never "the best configuration"
DEFAULT_MAX_TOKENS = 128
BUILTIN_SUITE = Path(__file__).parent / "prompts" / "suite.yaml"
# Built-in prompt files by name (--prompts sessions): workloads that repeat across requests.
BUILTIN_PROMPTS = {"suite": BUILTIN_SUITE, "sessions": BUILTIN_SUITE.with_name("sessions.yaml")}
BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0

METHOD = {
    "interleaving": "per prompt and repeat: target alone, then each configuration in order",
    "cache": "every run starts from an empty KV cache (prompt processing included)",
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


# --- prompts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str | None = None  # a user message (through the chat template unless --raw)
    messages: tuple[dict[str, str], ...] = ()
    system: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    prediction: str | None = None  # text the answer is expected to mostly repeat
    # Requests of one session run in file order and share history: a "+history" mode drafts
    # from the session's earlier prompts and answers (shell loops, agents, editors).
    session: str | None = None

    def tokens(self, target: Backend, *, raw: bool, system: str | None) -> list[int]:
        if not self.messages:
            return prompt_tokens(target, self.text or "", system=self.system or system, raw=raw)
        if raw:  # no template: the contents as plain text
            text = "\n\n".join(m["content"] for m in self.messages)
            return target.tokenize(text, add_special=True)
        return encode_chat(target, [dict(m) for m in self.messages])


_PROMPT_FIELDS = {
    "id",
    "category",
    "text",
    "messages",
    "system",
    "max_tokens",
    "prediction",
    "session",
}
_FORMAT_FIX = (
    "Each prompt needs id, category, and text or messages (a list of {role, content}); "
    "max_tokens, system, prediction and session are optional. See specdec_cli/prompts/."
)


def load_prompts(path: Path | None = None) -> list[BenchPrompt]:
    """The built-in suite, or a YAML (list, or {prompts: list}) or JSONL file of prompts, or
    a built-in file by name (BUILTIN_PROMPTS) where no such file exists."""
    source = path or BUILTIN_SUITE
    if not source.exists() and str(source) in BUILTIN_PROMPTS:
        source = BUILTIN_PROMPTS[str(source)]
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadUsageError(
            f"cannot read the prompts file {source}: {exc.strerror or exc}.", "Check the path."
        ) from None
    items = _parse_jsonl(text, source) if _is_jsonl(source, text) else _parse_yaml(text, source)
    prompts = [_parse_prompt(item, source, i) for i, item in enumerate(items, 1)]
    if not prompts:
        raise BadUsageError(f"{source} holds no prompts.", _FORMAT_FIX)
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise BadUsageError(
                f"{source}: the prompt id '{prompt.id}' is used twice.",
                "Give every prompt its own id.",
            )
        seen.add(prompt.id)
    return prompts


def _is_jsonl(path: Path, text: str) -> bool:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    if path.suffix.lower() in (".yaml", ".yml"):
        return False
    return text.lstrip().startswith("{")


def _parse_jsonl(text: str, path: Path) -> list[Any]:
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise BadUsageError(
                f"{path}, line {number}: not valid JSON ({exc.msg}).",
                "Write one JSON object per line. " + _FORMAT_FIX,
            ) from None
    return items


def _parse_yaml(text: str, path: Path) -> list[Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f", line {where.line + 1}" if where is not None else ""
        raise BadUsageError(f"{path}{line}: not valid YAML.", _FORMAT_FIX) from None
    if isinstance(data, dict) and "prompts" in data:
        data = data["prompts"]
    if not isinstance(data, list):
        raise BadUsageError(
            f"{path}: expected a list of prompts (or a mapping with a 'prompts' list).",
            _FORMAT_FIX,
        )
    return data


def _parse_prompt(item: Any, path: Path, index: int) -> BenchPrompt:
    where = f"{path}: prompt {index}"
    if not isinstance(item, dict):
        raise BadUsageError(f"{where} is not a mapping.", _FORMAT_FIX)
    if isinstance(item.get("id"), str) and item["id"].strip():
        where += f" ('{item['id']}')"

    def fail(problem: str) -> BadUsageError:
        return BadUsageError(f"{where}: {problem}.", _FORMAT_FIX)

    unknown = sorted(set(item) - _PROMPT_FIELDS)
    if unknown:
        raise fail(f"unknown field(s) {', '.join(map(str, unknown))}")
    for key in ("id", "category"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise fail(f"'{key}' must be a non-empty string")
    if ("text" in item) == ("messages" in item):
        raise fail("give exactly one of 'text' and 'messages'")
    if "text" in item and (not isinstance(item["text"], str) or not item["text"].strip()):
        raise fail("'text' must be a non-empty string")
    messages = item.get("messages", [])
    if not isinstance(messages, list) or ("messages" in item and not messages):
        raise fail("'messages' must be a non-empty list")
    for message in messages:
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or not all(isinstance(v, str) for v in message.values())
        ):
            raise fail("each message must be {role: string, content: string}")
    for key in ("system", "prediction", "session"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise fail(f"'{key}' must be a string")
    max_tokens = item.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise fail(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    return BenchPrompt(
        id=item["id"].strip(),
        category=item["category"].strip(),
        text=item.get("text"),
        messages=tuple(dict(m) for m in messages),
        system=item.get("system"),
        max_tokens=max_tokens,
        prediction=item.get("prediction"),
        session=item.get("session"),
    )


def select_prompts(
    prompts: Sequence[BenchPrompt],
    categories: Iterable[str] = (),
    per_category: int | None = None,
) -> list[BenchPrompt]:
    """Keep the named categories (all if none), then the first `per_category` of each."""
    wanted = [c.strip() for item in categories for c in item.split(",") if c.strip()]
    known = list(dict.fromkeys(p.category for p in prompts))
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise BadUsageError(
            f"no prompts in the category {', '.join(unknown)}.",
            f"Categories here: {', '.join(known)}.",
        )
    chosen = [p for p in prompts if not wanted or p.category in wanted]
    if per_category is not None:
        counts: Counter = Counter()
        kept = []
        for prompt in chosen:
            counts[prompt.category] += 1
            if counts[prompt.category] <= per_category:
                kept.append(prompt)
        chosen = kept
    return chosen


# --- configurations: what is compared with the target alone -----------------------------------


@dataclass(frozen=True)
class Configuration:
    """One way of running speculatively: a drafting mode and its settings, under a label."""

    label: str
    drafter: str = "combined"  # the drafting mode; see adaptive.build_drafter
    draft_max: int = 8
    draft_model: str | None = None  # one of the extra drafters by name; None: the main one
    prediction: bool = False  # drafts may follow the prompt's prediction (Predicted Outputs)
    history: bool = False  # drafts may follow the session's earlier prompts and answers

    def settings(self, base: GenerationSettings) -> GenerationSettings:
        prediction = base.prediction if self.prediction else ()
        return replace(base, draft_max=self.draft_max, prediction=prediction)

    def as_dict(self) -> dict:
        return asdict(self)


def configurations(
    draft_max: Sequence[int] | None,
    modes: Sequence[str] = ("combined",),
    extra_drafts: Sequence[str] = (),
    exact: bool = False,
) -> list[Configuration]:
    """Every mode at every draft length, in that order (a --draft-max sweep is one axis);
    without lengths, each mode at its default. Modes that use a draft model run once more
    with each extra drafter. Exact benches first run the target alone with the exact
    kernels: what exactness costs, and the answer every exact configuration must give."""
    for mode in modes:
        check_bench_mode(mode)
    found = [Configuration(EXACT_ALONE, "none", 1)] if exact else []
    for mode_name in modes:
        mode, predicted, history = split_mode(mode_name)
        drafts = [None, *extra_drafts] if mode in NEEDS_DRAFT_MODEL else [None]
        for draft in drafts:
            if mode == ORACLE:  # its lengths come from the cost table, as long as pays
                found.append(Configuration(ORACLE, ORACLE, ADAPTIVE_DRAFT_LIMIT))
                continue
            for k in dict.fromkeys(draft_max or [default_draft_max(mode)]):
                label = f"{mode_name} k={k}" + (f" ({draft})" if draft else "")
                found.append(Configuration(label, mode, k, draft, predicted, history))
    return found


@dataclass
class OracleDrafter:
    """The ceiling: drafts the target alone's own answer to the same prompt, obtained in the
    same run, so every draft is kept. Each round drafts the length with the most tokens per
    second in the measured cost table; once the answer has left that text (it cannot in
    exact mode), nothing. A measuring instrument: only bench offers it."""

    reference: tuple[int, ...]
    costs: CostModel
    prompt_length: int = 0

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.prompt_length = prompt_length

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        answer = tuple(context[self.prompt_length :])
        if self.reference[: len(answer)] != answer:
            return Draft.empty()
        rest = self.reference[len(answer) : len(answer) + max_tokens]
        k = max(range(len(rest) + 1), key=lambda k: (k + 1) / self.costs.verify(k + 1))
        return ngram_draft(rest[:k], len(answer), source=ORACLE) if k else Draft.empty()

    def observe(self, outcome: Outcome) -> None:
        pass


PREDICTION_SUFFIX = "+prediction"
HISTORY_SUFFIX = "+history"


def split_mode(name: str) -> tuple[str, bool, bool]:
    """'combined+prediction+history' -> ('combined', True, True): the mode, whether its
    drafts may follow the prompt's prediction, and the session's history."""
    mode, suffixes = name, set[str]()
    while suffix := next((s for s in (PREDICTION_SUFFIX, HISTORY_SUFFIX) if mode.endswith(s)), ""):
        mode, suffixes = mode[: -len(suffix)], suffixes | {suffix}
    return mode, PREDICTION_SUFFIX in suffixes, HISTORY_SUFFIX in suffixes


def check_bench_mode(name: str) -> str:
    mode, predicted, history = split_mode(name)
    if mode not in BENCH_MODES or ((predicted or history) and mode in ("fixed", ORACLE)):
        raise BadUsageError(
            f"unknown drafter '{name}'.",
            f"Use one of {', '.join(BENCH_MODES)}; an adaptive mode (combined, model, ngram) "
            f"may end in {PREDICTION_SUFFIX} to follow the prompts' predictions and in "
            f"{HISTORY_SUFFIX} to draft from the session's earlier requests.",
        )
    return name


def make_drafter(
    configuration: Configuration,
    pair: ModelPair,
    reference: Sequence[int] = (),
    history: HistoryIndex | None = None,
) -> Drafter | None:
    """The one place a configuration becomes a drafter (fresh per run: drafters learn as they
    go). The pair's costs, measured once per bench, spare each run its own timing probe.
    `reference`: the target alone's answer in this repeat, for the oracle; `history`: the
    session's earlier prompts and answers, for "+history" modes."""
    if configuration.drafter == "none":
        return None
    if configuration.drafter == ORACLE:
        assert pair.costs is not None  # measured before any run
        return OracleDrafter(tuple(reference), pair.costs)
    drafter, costs = pair.drafter, pair.costs
    if configuration.draft_model is not None:
        drafter, costs = pair.alternates[configuration.draft_model]
    if configuration.drafter in NEEDS_DRAFT_MODEL and drafter is None:
        raise BadUsageError(
            f"the '{configuration.drafter}' drafter needs a draft model.", "Pass --draft."
        )
    fresh = costs.fresh() if costs is not None else None  # each run learns on its own copy
    built = build_drafter(configuration.drafter, pair.target, drafter, costs=fresh)
    use_history(built, history if configuration.history else None)
    return built


def parse_int_list(text: str, option: str, largest: int | None = None) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BadUsageError(
            f"{option} takes positive integers separated by commas, got '{text}'.",
            f"For example {option} 2,4,8.",
        )
    if largest is not None and max(values) > largest:
        raise BadUsageError(
            f"{option} {max(values)} is more than the longest draft, {largest}.",
            f"Give values from 1 to {largest}.",
        )
    return values


# --- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return {
            "median": round(self.value, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
        }


def geometric_mean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def speedup_estimate(
    groups: Sequence[Sequence[float]], draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED
) -> Estimate | None:
    """Geometric mean over groups (prompts) of each group's median ratio, with a percentile
    bootstrap interval that resamples within each group (the timing noise of this machine)."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return None
    point = geometric_mean(float(np.median(a)) for a in arrays)
    rng = np.random.default_rng(seed)
    log_sum = np.zeros(draws)
    for a in arrays:
        samples = a[rng.integers(0, len(a), size=(draws, len(a)))]
        log_sum += np.log(np.median(samples, axis=1))
    boot = np.exp(log_sum / len(arrays))
    low, high = np.percentile(boot, [2.5, 97.5])
    return Estimate(point, float(low), float(high))


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


# --- records and aggregates -----------------------------------------------------------------


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

    def as_dict(self) -> dict:
        return {
            "prompt": self.prompt_id,
            "category": self.category,
            "side": self.side,
            "repeat": self.repeat,
            "seed": self.seed,
            "finish_reason": self.finish_reason,
            "text": self.text,
            **self.stats.as_dict(),
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


# --- the report ---------------------------------------------------------------------------


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
    started_at: str = field(default_factory=lambda: _now())
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
            },
            "categories": [row.as_dict() for row in category_rows],
            "prompts": [row.as_dict() for row in self.prompt_rows()],
            "runs": [run.as_dict() for run in self.runs],
        }


def write_json(report: BenchReport, path: Path) -> None:
    """To `path`, or stdout for '-'."""
    text = json.dumps(report.as_dict(), indent=1, ensure_ascii=False) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text, encoding="utf-8")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- running -------------------------------------------------------------------------------


class BenchProgress(Protocol):
    """What the run reports as it goes; units are tokens (each run counts its max_tokens)."""

    def stage(self, description: str, total: int | None = None) -> None: ...
    def advance(self, tokens: int) -> None: ...


class NoProgress:
    def stage(self, description: str, total: int | None = None) -> None:
        pass

    def advance(self, tokens: int) -> None:
        pass


@dataclass(frozen=True)
class BenchRequest:
    target: Path
    draft: Path | None
    prompts: list[BenchPrompt]
    configurations: list[Configuration]
    extra_drafts: dict[str, Path] = field(default_factory=dict)  # compared in the same run
    prompts_source: str = "built-in suite"
    repeats: int = 3
    warmup_tokens: int = 16
    max_tokens: int | None = None  # caps every prompt's own max_tokens
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0
    raw: bool = False
    system: str | None = None
    hardware: HardwareOptions = field(default_factory=HardwareOptions)
    force_incompatible: bool = False
    rule: SamplingRule = SamplingRule.INVARIANT

    def max_tokens_for(self, prompt: BenchPrompt) -> int:
        return min(prompt.max_tokens, self.max_tokens or prompt.max_tokens)

    def settings_record(self) -> dict:
        return {
            "target": str(self.target),
            "draft": None if self.draft is None else str(self.draft),
            "extra_drafts": {name: str(path) for name, path in self.extra_drafts.items()},
            "prompts": self.prompts_source,
            "prompt_ids": [p.id for p in self.prompts],
            "configurations": [c.as_dict() for c in self.configurations],
            "repeats": self.repeats,
            "warmup_tokens": self.warmup_tokens,
            "max_tokens": self.max_tokens,
            "sampling": asdict(self.sampling),
            "seed": self.seed,
            "rule": self.rule.value,
            "raw": self.raw,
            "system": self.system,
            "hardware": asdict(self.hardware),
        }


def run_bench(request: BenchRequest, progress: BenchProgress | None = None) -> BenchReport:
    """Load the pair, describe it and the machine, then measure. Failures while loading are
    ordinary errors; once measuring starts, see `measure`."""
    progress = progress or NoProgress()
    if not request.prompts:
        raise BadUsageError("no prompts to run.", "Check --category and --per-category.")
    progress.stage("loading models")
    pair = load_pair(request.target, request.draft, request.hardware, request.force_incompatible)
    fit_context(pair, request.hardware, _context_needed(pair.target, request))
    for name, path in request.extra_drafts.items():
        drafter = load_drafter(pair.target, path, request.hardware, request.force_incompatible)
        pair.alternates[name] = (drafter, None)
    progress.stage("timing decodes")
    pair.costs = measure_pair_costs(pair.target, pair.drafter)
    costs_fast = _fast_kernel_costs(pair) if request.hardware.exact else None
    for name, (drafter, _) in pair.alternates.items():
        pair.alternates[name] = (drafter, measure_pair_costs(pair.target, drafter))
    for configuration in request.configurations:
        make_drafter(configuration, pair)  # an unusable configuration fails before measuring
    progress.stage("hashing model files")
    models = {"target": model_record(pair.target, request.target)}
    if pair.drafter is not None and request.draft is not None:
        models["draft"] = model_record(pair.drafter, request.draft)
    for name, path in request.extra_drafts.items():
        models[f"draft:{name}"] = model_record(pair.alternates[name][0], path)
    machine = machine_info(request.hardware, pair.target.n_ctx)
    report = measure(pair, request, progress, models=models, machine=machine)
    report.costs_fast = costs_fast
    return report


def _fast_kernel_costs(pair: ModelPair) -> dict:
    """The target's decode costs with llama.cpp's own kernels (a probe, not used to plan)."""
    switch_kernels(pair.target, exact=False)
    try:
        return measure_pair_costs(pair.target, None).as_dict()
    finally:
        switch_kernels(pair.target, exact=True)


def switch_kernels(target: Backend, exact: bool) -> None:
    """The bench compares exact mode with llama.cpp's own kernels on one loaded target
    (a second load would hold a second copy of the repacked weights)."""
    if not isinstance(target, SwitchableKernels):
        raise TypeError(f"{type(target).__name__} cannot switch kernels")
    target.exact = exact


def _context_needed(target: Backend, request: BenchRequest) -> int:
    """Room for the longest prompt and its answer."""
    return max(
        len(prompt.tokens(target, raw=request.raw, system=request.system))
        + request.max_tokens_for(prompt)
        for prompt in request.prompts
    )


def measure(
    pair: ModelPair,
    request: BenchRequest,
    progress: BenchProgress,
    *,
    models: dict | None = None,
    machine: dict | None = None,
) -> BenchReport:
    """Warm up, then run the plan. A Ctrl-C or a SpecdecError (a model lost, a context
    overflow) ends it early: the report keeps what was measured and lists what is missing."""
    report = BenchReport(
        settings=request.settings_record(),
        prompts=list(request.prompts),
        configurations=list(request.configurations),
        repeats=request.repeats,
        models=models or {},
        machine=machine or {},
    )
    pooled = pair.costs.fresh() if pair.costs is not None else None
    try:
        _warm_up(pair, request, progress)
        total = sum(request.max_tokens_for(p) for p, _, _ in _plan(request))
        progress.stage("measuring", total=total)
        for prompt in request.prompts:
            _measure_prompt(pair, request, prompt, report, progress, pooled)
    except KeyboardInterrupt:
        report.stopped_by, report.exit_code = "interrupted", EXIT_INTERRUPTED
    except SpecdecError as error:
        report.stopped_by, report.exit_code = f"error: {error}", error.exit_code or 1
    report.finished_at = _now()
    report.costs = pooled.as_dict() if pooled is not None else None
    return report


def _plan(request: BenchRequest) -> list[tuple[BenchPrompt, str, int]]:
    sides = [TARGET_ALONE, *(c.label for c in request.configurations)]
    return [(p, s, r) for p in request.prompts for r in range(request.repeats) for s in sides]


def _sides(request: BenchRequest) -> list[tuple[str, Configuration | None]]:
    return [(TARGET_ALONE, None), *((c.label, c) for c in request.configurations)]


def _warm_up(pair: ModelPair, request: BenchRequest, progress: BenchProgress) -> None:
    """Page the weights in and settle the threads before anything is timed."""
    if request.warmup_tokens <= 0:
        return
    prompt = request.prompts[0]
    tokens = prompt.tokens(pair.target, raw=request.raw, system=request.system)
    check_prompt_fits(tokens, pair.target.n_ctx)
    base = GenerationSettings(
        max_tokens=min(request.warmup_tokens, request.max_tokens_for(prompt)),
        sampling=request.sampling,
        seed=request.seed,
        rule=request.rule,
    )
    for label, configuration in _sides(request):
        progress.stage(f"warming up · {label}")
        exact = configuration is not None and request.hardware.exact
        _generate(pair, tokens, base, configuration, NoProgress(), exact)


def _measure_prompt(
    pair: ModelPair,
    request: BenchRequest,
    prompt: BenchPrompt,
    report: BenchReport,
    progress: BenchProgress,
    pooled: CostModel | None = None,
) -> None:
    """Every side and repeat of one prompt; the timed decodes of runs that drafted with the
    main draft model go into `pooled`."""
    tokens = prompt.tokens(pair.target, raw=request.raw, system=request.system)
    check_prompt_fits(tokens, pair.target.n_ctx)
    report.prompt_tokens[prompt.id] = len(tokens)
    budget = request.max_tokens_for(prompt)
    for repeat in range(request.repeats):
        seed = request.seed + repeat  # both sides of a repeat sample with the same seed
        base = GenerationSettings(
            max_tokens=budget,
            sampling=request.sampling,
            seed=seed,
            rule=request.rule,
            prediction=prediction_tokens(pair.target, prompt.prediction),
        )
        wanted = any(c.history for c in request.configurations)
        history = _session_history(pair.target, request, report, prompt, repeat) if wanted else None
        for label, configuration in _sides(request):
            progress.stage(f"{prompt.id} · {label} · {repeat + 1}/{request.repeats}")
            exact = configuration is not None and request.hardware.exact
            oracle = configuration is not None and configuration.drafter == ORACLE
            answer = _reference_tokens(request, report, prompt.id, repeat) if oracle else []
            finished, costs = _generate(
                pair, tokens, base, configuration, progress, exact, answer, history
            )
            main_draft = configuration is not None and configuration.draft_model is None
            if pooled is not None and costs is not None and main_draft:
                pooled.absorb(costs)
            report.runs.append(
                RunRecord(
                    prompt.id,
                    prompt.category,
                    label,
                    repeat,
                    seed,
                    finished.tokens,
                    finished.text,
                    finished.finish_reason,
                    finished.stats,
                )
            )
    if request.sampling.greedy or request.rule == SamplingRule.INVARIANT:
        for configuration in request.configurations:
            reference = _reference(request, configuration)
            report.checks[(prompt.id, configuration.label)] = _check(
                pair.target, tokens, report, prompt.id, configuration.label, reference
            )


def _reference_tokens(
    request: BenchRequest, report: BenchReport, prompt_id: str, repeat: int
) -> list[int]:
    """The target alone's answer in this repeat (the exact one in exact mode): the oracle's."""
    run = report.by_repeat(prompt_id, _drafted_reference(request)).get(repeat)
    return run.tokens if run is not None else []


def _session_history(
    target: Backend, request: BenchRequest, report: BenchReport, prompt: BenchPrompt, repeat: int
) -> HistoryIndex:
    """What a "+history" run may draft from: the earlier requests of the prompt's session
    (file order), each its prompt and the target alone's answer in this repeat. Answers are
    the same in every configuration, so this is the history a real session would have."""
    history = HistoryIndex()
    if prompt.session is None:
        return history
    for earlier in request.prompts:
        if earlier.id == prompt.id:
            break
        if earlier.session == prompt.session:
            answer = _reference_tokens(request, report, earlier.id, repeat)
            earlier_prompt = earlier.tokens(target, raw=request.raw, system=request.system)
            history.add([*earlier_prompt, *answer])
    return history


def _reference(request: BenchRequest, configuration: Configuration) -> str:
    """Whose answer a configuration must give: the target alone with the same kernels."""
    return TARGET_ALONE if configuration.label == EXACT_ALONE else _drafted_reference(request)


def _drafted_reference(request: BenchRequest) -> str:
    """The target alone that drafting configurations must agree with."""
    labels = {c.label for c in request.configurations}
    return EXACT_ALONE if request.hardware.exact and EXACT_ALONE in labels else TARGET_ALONE


def _generate(
    pair: ModelPair,
    prompt: list[int],
    base: GenerationSettings,
    configuration: Configuration | None,
    progress: BenchProgress,
    exact: bool,
    reference: Sequence[int] = (),
    history: HistoryIndex | None = None,
) -> tuple[Finished, CostModel | None]:
    """One timed run from an empty cache, and the costs its drafter learned (adaptive modes).
    The target alone is Generation with no drafter: one token per decode, exactly what
    `specdec run --no-draft` does."""
    pair.reset()
    switch_kernels(pair.target, exact)
    drafter = None
    if configuration is None:
        generation = Generation(pair.target, prompt, base, drafter=None)
    else:
        drafter = make_drafter(configuration, pair, reference, history)
        generation = Generation(pair.target, prompt, configuration.settings(base), drafter)
    emitted = 0

    def advance(piece: Piece) -> None:
        nonlocal emitted
        if piece.token is not None:
            emitted += 1
            progress.advance(1)

    finished = generation.run(advance)
    progress.advance(max(0, base.max_tokens - emitted))  # a run that stopped early
    return finished, costs_of(drafter)


def _check(
    target: Backend,
    prompt: list[int],
    report: BenchReport,
    prompt_id: str,
    label: str,
    reference: str = TARGET_ALONE,
) -> OutputCheck:
    alone, spec = report.by_repeat(prompt_id, reference), report.by_repeat(prompt_id, label)
    shared = sorted(set(alone) & set(spec))
    first = shared[0]
    comparison = compare_outputs(target, prompt, spec[first].tokens, alone[first].tokens)
    identical = sum(1 for r in shared if spec[r].tokens == alone[r].tokens)
    return OutputCheck(comparison, identical, len(shared), reference)


# --- the machine and the model files ------------------------------------------------------------


def machine_info(hardware: HardwareOptions, n_ctx: int) -> dict:
    from . import llama_backend  # loaded already by the time a bench runs

    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": hardware.threads or llama_backend.default_threads(),
        "memory_bytes": _memory_bytes(),
        "load_average": _load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_backend.library_version(),
        "llama_cpp_system_info": llama_backend.system_info(),
        "rowwise_kernels": llama_backend.rowwise_kernels(),
        "gpu_offload_supported": llama_backend.supports_gpu_offload(),
        "gpu_layers": hardware.gpu_layers,
        "draft_gpu_layers": hardware.draft_gpu_layers,
        "rpc": list(hardware.rpc),  # the target's layers on these workers
        "tensor_split": list(hardware.tensor_split),
        "ctx_size": n_ctx,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def model_record(backend: Backend, path: Path) -> dict:
    from .fetch import cached_sha256

    record = {
        "path": str(path),
        "file": path.name,
        "size_bytes": path.stat().st_size,
        "sha256": cached_sha256(path),
    }
    info = backend.describe()
    record.update(
        description=info.get("description"),
        parameters=info.get("parameters"),
        n_vocab=info.get("n_vocab"),
    )
    return record
