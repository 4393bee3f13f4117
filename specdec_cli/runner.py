"""`specdec run`: one prompt, one answer, streamed; optionally checked against the target alone."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace

from . import render
from .adaptive import CostModel, costs_of
from .comparison import Comparison, compare_outputs
from .engine import Finished, Generation
from .errors import EXIT_INTERRUPTED
from .session import (
    DecodeRequest,
    ModelPair,
    check_prompt_fits,
    drafter_for,
    fit_context,
    load_models,
    prediction_tokens,
    prompt_tokens,
    remember_costs,
)

EXIT_OK = 0


@dataclass(frozen=True)
class RunRequest:
    decode: DecodeRequest
    prompt: str
    raw: bool = False
    verify: bool = False
    prediction: str | None = None  # --predict: text the answer is expected to mostly repeat

    def settings_record(self) -> dict:
        return {**self.decode.record(), "raw": self.raw, "predicted": self.prediction is not None}


def run_once(request: RunRequest, *, json_output: bool) -> int:
    err = render.stderr_console()
    show_progress = err.is_terminal and not json_output
    with err.status("loading models…", spinner="dots") if show_progress else nullcontext():
        pair = load_models(request.decode)
        prompt = prompt_tokens(
            pair.target, request.prompt, system=request.decode.system, raw=request.raw
        )
        fit_context(pair, request.decode.hardware, len(prompt) + request.decode.max_tokens)
        drafter = drafter_for(request.decode, pair)
    check_prompt_fits(prompt, pair.target.n_ctx)

    predicted = prediction_tokens(pair.target, request.prediction)
    settings = replace(request.decode.generation_settings(), prediction=predicted)
    generation = Generation(pair.target, prompt, settings, drafter=drafter)
    answer = None if json_output else render.AnswerStream(sys.stdout)
    finished, interrupted = _consume(generation, answer)
    costs = costs_of(drafter)
    if costs is not None:  # the next run starts from what this one measured
        remember_costs(pair, request.decode.hardware, costs)
    check = _check(pair, prompt, request, finished) if request.verify else None

    if answer is None:
        render.print_json(sys.stdout, _record(request, finished, check, costs))
    else:
        answer.finish_line()
        if interrupted:
            err.print("[yellow]interrupted:[/yellow] the answer above is partial.")
        if err.is_terminal or request.verify:
            render.print_stats(err, finished.stats, finished.finish_reason)
        if costs is not None and request.decode.hardware.verbose:
            render.print_costs(err, costs.as_dict())
        if check is not None:
            err.print(check.summary(finished), soft_wrap=True)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


@dataclass(frozen=True)
class Check:
    """--verify: the answer against the target alone's."""

    comparison: Comparison
    plain: Finished

    def summary(self, speculative: Finished) -> str:
        return render.comparison_summary(
            self.comparison,
            self.plain.stats.tokens_per_second,
            speculative.stats.tokens_per_second,
        )


def _consume(generation: Generation, answer: render.AnswerStream | None) -> tuple[Finished, bool]:
    """Run to the end, streaming pieces; Ctrl-C keeps what was produced."""
    try:
        return generation.run(answer.write if answer is not None else None), False
    except KeyboardInterrupt:
        return generation.interrupted(), True


def _check(pair: ModelPair, prompt: list[int], request: RunRequest, speculative: Finished) -> Check:
    settings = request.decode.generation_settings()
    plain_generation = Generation(pair.target, prompt, settings, drafter=None)
    plain, _ = _consume(plain_generation, None)
    return Check(compare_outputs(pair.target, prompt, speculative.tokens, plain.tokens), plain)


def _record(
    request: RunRequest, finished: Finished, check: Check | None, costs: CostModel | None
) -> dict:
    record = {
        "text": finished.text,
        "tokens": finished.tokens,
        "finish_reason": finished.finish_reason,
        "stats": finished.stats.as_dict(),
        "settings": request.settings_record(),
        # The decode costs the planner started from and ended with (adaptive modes).
        "costs": None if costs is None else costs.as_dict(),
    }
    if check is not None:
        record["verify"] = {
            **check.comparison.as_dict(),
            "target_alone": check.plain.stats.as_dict(),
        }
    return record
