"""`specdec bench`: the target alone against speculative configurations, measured honestly.

The run itself; the prompt files are bench_prompts.py, what is compared bench_configs.py,
the statistics and the report bench_report.py. Nothing here imports Rich (render_bench.py
draws it; the CLI drives the run).

Method, per prompt: after one short warm-up of every side, each repeat runs the target alone
(the plain one-token-per-decode path, drafter=None) and then every configuration, interleaved
(A B C A B C ...), on the same loaded models. Every run starts from an empty KV cache, so
each pays its own prompt processing, as a user's run would; but a `warm` prompt of a session
(an agent's next turn) starts from the caches its session's previous request left, as on a
server: that request runs first, untimed, on the same side. Speedup is paired: a
configuration's tokens/s over the target alone's in the same repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..decoding.backend import Backend, SwitchableKernels
from ..decoding.comparison import compare_outputs
from ..decoding.costs import CostModel
from ..decoding.engine import (
    Finished,
    Generation,
    GenerationSettings,
    Piece,
    SamplingRule,
)
from ..decoding.history import HistoryIndex
from ..decoding.modes import costs_of, measure_pair_costs
from ..errors import EXIT_INTERRUPTED, BadUsageError, SpecdecError
from ..models.loading import ModelLoader, ModelPair, load_with_llama_cpp
from ..services.lifecycle import loaded_pair
from ..services.prompting import check_prompt_fits, prediction_tokens
from .bench_configs import (
    EXACT_ALONE,
    TARGET_ALONE,
    BenchOnly,
    Configuration,
    make_drafter,
)
from .bench_machine import machine_info, model_record, timestamp
from .bench_prompts import BenchPrompt
from .bench_report import BenchReport, OutputCheck, RunRecord
from .bench_request import BenchRequest


class BenchProgress(Protocol):
    """What the run reports as it goes; units are tokens (each run counts its max_tokens)."""

    def stage(self, description: str, total: int | None = None) -> None: ...
    def advance(self, tokens: int) -> None: ...


class NoProgress:
    def stage(self, description: str, total: int | None = None) -> None:
        pass

    def advance(self, tokens: int) -> None:
        pass


def run_bench(
    request: BenchRequest,
    progress: BenchProgress | None = None,
    loader: ModelLoader = load_with_llama_cpp,
) -> BenchReport:
    """Load the pair as every command does (services/lifecycle.py), describe it and the
    machine, then measure; the costs the drafting runs measured are written back for the
    next command. Failures while loading are ordinary errors; once measuring starts, see
    `measure`."""
    progress = progress or NoProgress()
    if not request.prompts:
        raise BadUsageError("no prompts to run.", "Check --category and --per-category.")
    progress.stage("loading models")
    with loaded_pair(request.decode, loader) as loaded:
        pair = loaded.pair
        loaded.prepare(_context_needed(pair.target, request))
        for name, path in request.extra_drafts.items():
            loaded.add_drafter(name, path)
        progress.stage("timing decodes")
        costs_fast = _measure_costs(pair, request.decode.hardware.exact)
        for configuration in request.configurations:
            make_drafter(configuration, pair)  # an unusable configuration fails before measuring
        progress.stage("hashing model files")
        models = _model_records(pair, request)
        machine = machine_info(request.decode.hardware, pair.target.n_ctx)
        pooled = pair.costs.fresh() if pair.costs is not None else None
        loaded.measured = pooled
        report = measure(pair, request, progress, pooled, models=models, machine=machine)
    report.costs_fast = costs_fast
    return report


def _measure_costs(pair: ModelPair, exact: bool) -> dict | None:
    """Time every drafter beside the target, once for the whole bench; in exact mode also
    the target with llama.cpp's own kernels (returned, for the report)."""
    pair.costs = measure_pair_costs(pair.target, pair.drafter, pair.drafts_by_text(pair.drafter))
    costs_fast = _fast_kernel_costs(pair) if exact else None
    for name, (drafter, _) in pair.alternates.items():
        costs = measure_pair_costs(pair.target, drafter, pair.drafts_by_text(drafter))
        pair.alternates[name] = (drafter, costs)
    return costs_fast


def _model_records(pair: ModelPair, request: BenchRequest) -> dict:
    decode = request.decode
    models = {"target": model_record(pair.target, decode.target)}
    if pair.drafter is not None and decode.draft is not None:
        models["draft"] = model_record(pair.drafter, decode.draft)
    for name, path in request.extra_drafts.items():
        models[f"draft:{name}"] = model_record(pair.alternates[name][0], path)
    return models


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
        len(prompt.tokens(target, raw=request.raw, system=request.decode.system))
        + request.max_tokens_for(prompt)
        for prompt in request.prompts
    )


def measure(
    pair: ModelPair,
    request: BenchRequest,
    progress: BenchProgress,
    pooled: CostModel | None = None,
    *,
    models: dict | None = None,
    machine: dict | None = None,
) -> BenchReport:
    """Warm up, then run the plan. A Ctrl-C or a SpecdecError (a model lost, a context
    overflow) ends it early: the report keeps what was measured and lists what is missing.
    The timed decodes of runs that draft with the main draft model go into `pooled`."""
    report = BenchReport(
        settings=request.settings_record(),
        prompts=list(request.prompts),
        configurations=list(request.configurations),
        repeats=request.repeats,
        models=models or {},
        machine=machine or {},
    )
    references: References = {}
    try:
        _warm_up(pair, request, progress)
        total = sum(request.max_tokens_for(p) for p, _, _ in _plan(request))
        progress.stage("measuring", total=total)
        for prompt in request.prompts:
            _measure_prompt(pair, request, prompt, report, progress, references, pooled)
    except KeyboardInterrupt:
        report.stopped_by, report.exit_code = "interrupted", EXIT_INTERRUPTED
    except SpecdecError as error:
        report.stopped_by, report.exit_code = f"error: {error}", error.exit_code or 1
    report.finished_at = timestamp()
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
    tokens = prompt.tokens(pair.target, raw=request.raw, system=request.decode.system)
    check_prompt_fits(tokens, pair.target.n_ctx)
    base = GenerationSettings(
        max_tokens=min(request.warmup_tokens, request.max_tokens_for(prompt)),
        sampling=request.decode.sampling,
        seed=request.seed(0),
        rule=request.decode.rule,
    )
    for label, configuration in _sides(request):
        progress.stage(f"warming up · {label}")
        exact = configuration is not None and request.decode.hardware.exact
        _generate(pair, tokens, base, configuration, NoProgress(), exact)


def _measure_prompt(
    pair: ModelPair,
    request: BenchRequest,
    prompt: BenchPrompt,
    report: BenchReport,
    progress: BenchProgress,
    references: References,
    pooled: CostModel | None = None,
) -> None:
    """Every side and repeat of one prompt; the target alone's answers (the reference the
    oracle drafts and later requests of a session remember) go into `references`, the
    timed decodes of runs that drafted with the main draft model into `pooled`."""
    tokens = prompt.tokens(pair.target, raw=request.raw, system=request.decode.system)
    check_prompt_fits(tokens, pair.target.n_ctx)
    report.prompt_tokens[prompt.id] = len(tokens)
    for repeat in range(request.repeats):
        seed = request.seed(repeat)  # both sides of a repeat sample with the same seed
        base = _settings(pair, request, prompt, seed)
        wanted = any(c.drafter.history for c in request.configurations)
        history = (
            _session_history(pair.target, request, references, prompt, repeat) if wanted else None
        )
        for label, configuration in _sides(request):
            progress.stage(f"{prompt.id} · {label} · {repeat + 1}/{request.repeats}")
            exact = configuration is not None and request.decode.hardware.exact
            answer = _oracle_answer(configuration, references, prompt, repeat)
            warmed = _serve_previous(pair, request, prompt, repeat, configuration, references)
            decoding = _decode_seconds(pair)
            finished, costs = _generate(
                pair, tokens, base, configuration, progress, exact, answer, history, warmed
            )
            decoding = _decode_seconds(pair) - decoding
            if label == _drafted_reference(request):
                references[(prompt.id, repeat)] = finished.tokens
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
                    prompt.valid(finished.text),
                    decoding,
                )
            )
    if request.decode.sampling.greedy or request.decode.rule == SamplingRule.INVARIANT:
        for configuration in request.configurations:
            reference = _reference(request, configuration)
            report.checks[(prompt.id, configuration.label)] = _check(
                pair.target, tokens, report, prompt.id, configuration.label, reference
            )


def _decode_seconds(pair: ModelPair) -> float:
    return sum(backend.decode_seconds for backend in pair.backends())


# (prompt id, repeat) -> the target alone's answer (the exact one in exact mode)
References = dict[tuple[str, int], list[int]]


def _settings(
    pair: ModelPair, request: BenchRequest, prompt: BenchPrompt, seed: int
) -> GenerationSettings:
    return GenerationSettings(
        max_tokens=request.max_tokens_for(prompt),
        sampling=request.decode.sampling,
        seed=seed,
        rule=request.decode.rule,
        prediction=prediction_tokens(pair.target, prompt.prediction),
        structure=prompt.structure(),
    )


def _oracle_answer(
    configuration: Configuration | None,
    references: References,
    prompt: BenchPrompt,
    repeat: int,
) -> list[int]:
    """What the oracle drafts on this side (nothing on the others)."""
    oracle = configuration is not None and configuration.mode == BenchOnly.ORACLE
    return references.get((prompt.id, repeat), []) if oracle else []


def _serve_previous(
    pair: ModelPair,
    request: BenchRequest,
    prompt: BenchPrompt,
    repeat: int,
    configuration: Configuration | None,
    references: References,
) -> bool:
    """For a warm prompt, run its session's previous request untimed on the same side, from
    empty caches, so the timed run starts from what it left (as a server's slot would keep
    it). Whether it ran."""
    previous = _previous_in_session(request, prompt) if prompt.warm else None
    if previous is None:
        return False
    tokens = previous.tokens(pair.target, raw=request.raw, system=request.decode.system)
    check_prompt_fits(tokens, pair.target.n_ctx)
    base = _settings(pair, request, previous, request.seed(repeat))
    exact = configuration is not None and request.decode.hardware.exact
    answer = _oracle_answer(configuration, references, previous, repeat)
    history = None
    if configuration is not None and configuration.drafter.history:
        history = _session_history(pair.target, request, references, previous, repeat)
    _generate(pair, tokens, base, configuration, NoProgress(), exact, answer, history)
    return True


def _previous_in_session(request: BenchRequest, prompt: BenchPrompt) -> BenchPrompt | None:
    if prompt.session is None:
        return None
    earlier = None
    for candidate in request.prompts:
        if candidate.id == prompt.id:
            return earlier
        if candidate.session == prompt.session:
            earlier = candidate
    return None


def _session_history(
    target: Backend,
    request: BenchRequest,
    references: References,
    prompt: BenchPrompt,
    repeat: int,
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
            answer = references.get((earlier.id, repeat), [])
            earlier_prompt = earlier.tokens(target, raw=request.raw, system=request.decode.system)
            history.add([*earlier_prompt, *answer])
    return history


def _reference(request: BenchRequest, configuration: Configuration) -> str:
    """Whose answer a configuration must give: the target alone with the same kernels."""
    return TARGET_ALONE if configuration.label == EXACT_ALONE else _drafted_reference(request)


def _drafted_reference(request: BenchRequest) -> str:
    """The target alone that drafting configurations must agree with."""
    labels = {c.label for c in request.configurations}
    return EXACT_ALONE if request.decode.hardware.exact and EXACT_ALONE in labels else TARGET_ALONE


def _generate(
    pair: ModelPair,
    prompt: list[int],
    base: GenerationSettings,
    configuration: Configuration | None,
    progress: BenchProgress,
    exact: bool,
    reference: Sequence[int] = (),
    history: HistoryIndex | None = None,
    warmed: bool = False,
) -> tuple[Finished, CostModel | None]:
    """One timed run from an empty cache (`warmed`: from what the run before it left), and
    the costs its drafter learned (adaptive modes). The target alone is Generation with no
    drafter: one token per decode, exactly what `specdec run --no-draft` does."""
    if not warmed:
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
