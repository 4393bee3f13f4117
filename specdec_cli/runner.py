"""`specdec run`: one prompt, one answer, streamed; optionally checked against the target alone."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import render
from .adaptive import build_drafter
from .comparison import Comparison, compare_outputs
from .engine import Finished, Generation, GenerationSettings, Piece
from .sampling import SamplingSettings
from .session import (
    HardwareOptions,
    ModelPair,
    check_prompt_fits,
    load_pair,
    pair_costs,
    prompt_tokens,
)

EXIT_OK = 0
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class RunRequest:
    prompt: str
    target: Path
    draft: Path | None
    drafter_mode: str  # see adaptive.build_drafter; "none" for the target alone
    system: str | None
    raw: bool
    sampling: SamplingSettings
    seed: int | None
    max_tokens: int
    stop: tuple[str, ...]
    draft_max: int
    hardware: HardwareOptions
    force_incompatible: bool
    verify: bool

    def generation_settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=self.max_tokens,
            draft_max=self.draft_max,
            stop=self.stop,
            sampling=self.sampling,
            seed=self.seed,
        )

    def settings_record(self) -> dict:
        return {
            "target": str(self.target),
            "draft": None if self.draft is None else str(self.draft),
            "sampling": asdict(self.sampling),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "draft_max": self.draft_max,
            "drafter": self.drafter_mode,
            "raw": self.raw,
            "system": self.system,
            "hardware": asdict(self.hardware),
        }


def run_once(request: RunRequest, *, json_output: bool) -> int:
    err = render.stderr_console()
    show_progress = err.is_terminal and not json_output
    with err.status("loading models…", spinner="dots") if show_progress else _nothing():
        pair = load_pair(
            request.target, request.draft, request.hardware, request.force_incompatible
        )
    prompt = prompt_tokens(pair.target, request.prompt, system=request.system, raw=request.raw)
    check_prompt_fits(prompt, pair.target.n_ctx)

    generation = Generation(
        pair.target, prompt, request.generation_settings(), drafter=_drafter(pair, request)
    )
    answer = None if json_output else render.AnswerStream(sys.stdout)
    finished, interrupted = _consume(generation, answer)
    comparison, plain = _verify(pair, prompt, request, finished) if request.verify else (None, None)

    if json_output:
        render.print_json(sys.stdout, _record(request, finished, comparison, plain))
    else:
        answer.finish_line()
        if interrupted:
            err.print("[yellow]interrupted:[/yellow] the answer above is partial.")
        if err.is_terminal or request.verify:
            render.print_stats(err, finished.stats, finished.finish_reason)
        if comparison is not None:
            err.print(
                render.comparison_summary(
                    comparison, plain.stats.tokens_per_second, finished.stats.tokens_per_second
                ),
                soft_wrap=True,
            )
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


def _drafter(pair: ModelPair, request: RunRequest):
    if request.drafter_mode == "none":
        return None
    costs = pair_costs(pair, request.hardware)
    return build_drafter(request.drafter_mode, pair.target, pair.drafter, costs=costs)


def _consume(generation: Generation, answer: render.AnswerStream | None) -> tuple[Finished, bool]:
    """Run to the end, streaming pieces; Ctrl-C keeps what was produced."""
    try:
        for event in generation.events():
            if isinstance(event, Piece) and answer is not None:
                answer.write(event)
            elif isinstance(event, Finished):
                return event, False
    except KeyboardInterrupt:
        return generation.interrupted(), True
    raise RuntimeError("generation ended without a Finished event")


def _verify(
    pair: ModelPair, prompt: list[int], request: RunRequest, speculative: Finished
) -> tuple[Comparison, Finished]:
    plain_generation = Generation(pair.target, prompt, request.generation_settings(), drafter=None)
    plain, _ = _consume(plain_generation, None)
    return compare_outputs(pair.target, prompt, speculative.tokens, plain.tokens), plain


def _record(
    request: RunRequest, finished: Finished, comparison: Comparison | None, plain: Finished | None
) -> dict:
    record = {
        "text": finished.text,
        "tokens": finished.tokens,
        "finish_reason": finished.finish_reason,
        "stats": finished.stats.as_dict(),
        "settings": request.settings_record(),
    }
    if comparison is not None:
        record["verify"] = {**comparison.as_dict(), "target_alone": plain.stats.as_dict()}
    return record


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
