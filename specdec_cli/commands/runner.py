"""`specdec run`: one prompt, one answer, streamed; optionally checked against the target alone."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import render
from ..decoding.backend import Backend
from ..decoding.comparison import Comparison, compare_outputs
from ..decoding.costs import CostModel
from ..decoding.drafters import Drafter
from ..decoding.engine import Finished, Generation, Piece
from ..decoding.history import HistoryIndex
from ..decoding.modes import use_history
from ..errors import EXIT_INTERRUPTED
from ..models.loading import ModelLoader, ModelPair, load_with_llama_cpp
from ..request import DecodeRequest
from ..services.drafting import load_history
from ..services.history_file import HistoryFile
from ..services.lifecycle import loaded_pair
from ..services.prompt_cache import PromptCache, StatefulBackend, prompt_cache_key
from ..services.prompting import (
    check_prompt_fits,
    fill_in_middle_tokens,
    prediction_tokens,
    prompt_tokens,
)
from ..services.tool_calls import Function, HeldText, ToolCall, split_calls, template_speaks_tools
from ..structured import StructureError

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0


@dataclass(frozen=True)
class RunRequest:
    decode: DecodeRequest
    prompt: str
    raw: bool = False
    verify: bool = False
    prediction: str | None = None  # --predict: text the answer is expected to mostly repeat
    history: Path | None = None  # --history: a folder of earlier prompts and answers
    prompt_cache: Path | None = None  # --prompt-cache: a folder of saved KV states
    tools: tuple[Function, ...] = ()  # --tools, offered to the model (none: --tool-choice none)
    suffix: str | None = None  # --suffix: fill in the middle, between the prompt and this

    def settings_record(self) -> dict:
        record = {**self.decode.record(), "raw": self.raw, "predicted": self.prediction is not None}
        record["fill_in_middle"] = self.suffix is not None
        return record | ({"tools": [f.name for f in self.tools]} if self.tools else {})

    def template_tools(self) -> list[dict] | None:
        return [f.template_entry() for f in self.tools] or None


@dataclass
class _ToolAnswer:
    """--tools: content streams while held back from where a call may begin; at the end the
    calls are split out of the answer."""

    names: list[str]
    held: HeldText = field(default_factory=HeldText)

    def writer(self, answer: render.AnswerStream) -> Callable[[Piece], None]:
        return lambda piece: answer.write_text(self.held.feed(piece.text))

    def finish(self, answer: render.AnswerStream) -> None:
        """What was held, as content, then each call as one JSON line."""
        rest, calls = split_calls(self.held.held, self.names)
        answer.write_text(rest)
        answer.finish_line()
        for call in calls:
            arguments = json.loads(call.arguments)
            answer.write_text(json.dumps({"name": call.name, "arguments": arguments}) + "\n")

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        return split_calls(text, self.names)


def _prompt_tokens(request: RunRequest, target: Backend) -> list[int]:
    if request.suffix is not None:
        return fill_in_middle_tokens(target, request.prompt, request.suffix)
    return prompt_tokens(
        target,
        request.prompt,
        system=request.decode.system,
        raw=request.raw,
        tools=request.template_tools(),
    )


def run_once(
    request: RunRequest, *, json_output: bool, loader: ModelLoader = load_with_llama_cpp
) -> int:
    err = render.stderr_console()
    show_progress = err.is_terminal and not json_output
    with ExitStack() as lifetime:
        with err.status("loading models…", spinner="dots") if show_progress else nullcontext():
            loaded = lifetime.enter_context(loaded_pair(request.decode, loader))
            pair = loaded.pair
            _check_template_speaks_tools(request, pair)
            prompt = _prompt_tokens(request, pair.target)
            drafter = loaded.prepare(len(prompt) + request.decode.max_tokens)
            memory = _Memory.open(request, pair, drafter, err)
        check_prompt_fits(prompt, pair.target.n_ctx)
        memory.restore(pair, prompt)

        predicted = prediction_tokens(pair.target, request.prediction)
        settings = replace(request.decode.generation_settings(), prediction=predicted)
        generation = Generation(pair.target, prompt, settings, drafter=drafter)
        answer = None if json_output else render.AnswerStream(sys.stdout)
        tools = _ToolAnswer([f.name for f in request.tools]) if request.tools else None
        finished, interrupted = _consume(generation, _writer(answer, tools))
        if not interrupted:
            memory.keep(pair, prompt, finished, err)
        # Interrupted: no --verify pass, there is no whole answer to compare.
        check = None
        if request.verify and not interrupted:
            check = _check(pair, prompt, request, finished)
        costs = loaded.costs
    if tools is not None and answer is not None:
        tools.finish(answer)
    _report(request, finished, check, costs, memory, answer, interrupted, err, tools)
    return EXIT_INTERRUPTED if interrupted or (request.verify and check is None) else EXIT_OK


def _report(
    request: RunRequest,
    finished: Finished,
    check: Check | None,
    costs: CostModel | None,
    memory: _Memory,
    answer: render.AnswerStream | None,
    interrupted: bool,
    err: Console,
    tools: _ToolAnswer | None,
) -> None:
    if answer is None:
        record = _record(request, finished, check, costs, memory)
        render.print_json(sys.stdout, record | _tool_record(tools, finished))
        return
    answer.finish_line()
    if interrupted:
        err.print("[yellow]interrupted:[/yellow] the answer above is partial.")
    elif request.verify and check is None:
        err.print("[yellow]interrupted:[/yellow] the answer is whole; --verify did not finish.")
    if err.is_terminal or request.verify:
        render.print_stats(err, finished.stats, finished.finish_reason)
    if costs is not None and request.decode.hardware.verbose:
        render.print_costs(err, costs.as_dict())
    if check is not None:
        err.print(check.summary(finished), soft_wrap=True)


@dataclass
class _Memory:
    """--history and --prompt-cache: what a run reads before it answers and keeps after."""

    history: HistoryFile | None = None
    index: HistoryIndex | None = None  # the file's documents, drafted from
    cache: PromptCache | None = None
    documents: int = 0  # earlier prompts and answers --history offered to draft from
    # Prompt tokens restored from a saved state, and the seconds looking and restoring took.
    restored: tuple[int, float] | None = None

    @classmethod
    def open(
        cls, request: RunRequest, pair: ModelPair, drafter: Drafter | None, err: Console
    ) -> _Memory:
        memory = cls()
        if request.history is not None:
            memory.history, memory.index, damaged = load_history(
                request.history, request.decode.target
            )
            render.print_history_damage(err, memory.history.path, damaged)
            use_history(drafter, memory.index)
            memory.documents = len(memory.index)
        if request.prompt_cache is not None and isinstance(pair.target, StatefulBackend):
            key = prompt_cache_key(pair, request.decode.hardware)
            memory.cache = PromptCache(request.prompt_cache, key)
        return memory

    def restore(self, pair: ModelPair, prompt: list[int]) -> None:
        """Load the saved state sharing the longest prefix with the prompt; the first decode
        then computes only the rest, as for any cached prefix."""
        if self.cache is None or not isinstance(pair.target, StatefulBackend):
            return
        began = time.perf_counter()
        found = self.cache.best(prompt, pair.target)
        reused = 0
        if found is not None and self.cache.restore(found[0], pair.target, _stateful(pair.drafter)):
            reused = found[1]
        self.restored = (reused, time.perf_counter() - began)

    def as_record(self) -> dict:
        restored = self.restored
        return {
            "history": None if self.history is None else {"documents": self.documents},
            # Before the generation, so not in first_token_seconds.
            "prompt_cache": None
            if restored is None
            else {"reused_tokens": restored[0], "restore_seconds": round(restored[1], 4)},
        }

    def keep(self, pair: ModelPair, prompt: list[int], finished: Finished, err: Console) -> None:
        if self.history is not None and self.index is not None:
            problem = self.history.append(self.index.add_turn(prompt, finished.tokens))
            if problem:
                render.print_warning(err, "history", problem)
        if self.cache is not None and isinstance(pair.target, StatefulBackend):
            self.cache.store(prompt, pair.target, _stateful(pair.drafter))
            render.print_skipped_cache_files(err, self.cache.skipped)
            if self.cache.problem:
                render.print_warning(err, "prompt cache", self.cache.problem)


def _stateful(backend: object) -> StatefulBackend | None:
    return backend if isinstance(backend, StatefulBackend) else None


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


def _check_template_speaks_tools(request: RunRequest, pair: ModelPair) -> None:
    if request.tools and not template_speaks_tools(pair.target.chat_template()):
        raise StructureError(
            f"the chat template of {request.decode.target.name} cannot express tools.",
            "Use a target whose template renders tools and <tool_call> tags (Qwen2.5's does), "
            "or leave out --tools.",
        )


def _writer(
    answer: render.AnswerStream | None, tools: _ToolAnswer | None
) -> Callable[[Piece], None] | None:
    if answer is None:
        return None
    return tools.writer(answer) if tools is not None else answer.write


def _tool_record(tools: _ToolAnswer | None, finished: Finished) -> dict:
    """--tools in the JSON record: the content outside the calls, the calls in OpenAI's
    shape, and finish_reason "tool_calls" when there are any."""
    if tools is None:
        return {}
    content, calls = tools.split(finished.text)
    record: dict = {"text": content, "tool_calls": [call.as_dict() for call in calls]}
    return record | ({"finish_reason": "tool_calls"} if calls else {})


def _consume(
    generation: Generation, write: Callable[[Piece], None] | None
) -> tuple[Finished, bool]:
    """Run to the end, streaming pieces; Ctrl-C keeps what was produced."""
    try:
        return generation.run(write), False
    except KeyboardInterrupt:
        return generation.interrupted(), True


def _check(
    pair: ModelPair, prompt: list[int], request: RunRequest, speculative: Finished
) -> Check | None:
    """The target alone's answer beside the speculative one; None if Ctrl-C stopped it."""
    settings = request.decode.generation_settings()
    try:
        plain = Generation(pair.target, prompt, settings, drafter=None).run()
    except KeyboardInterrupt:
        return None
    return Check(compare_outputs(pair.target, prompt, speculative.tokens, plain.tokens), plain)


def _record(
    request: RunRequest,
    finished: Finished,
    check: Check | None,
    costs: CostModel | None,
    memory: _Memory,
) -> dict:
    record = {
        "text": finished.text,
        "tokens": finished.tokens,
        "finish_reason": finished.finish_reason,
        "stats": finished.stats.as_dict(),
        "settings": request.settings_record(),
        # The decode costs the planner started from and ended with (adaptive modes).
        "costs": None if costs is None else costs.as_dict(),
        # --history: the earlier documents there were to draft from; --prompt-cache: the
        # prompt tokens a saved state gave, and the seconds finding and restoring it took.
        **memory.as_record(),
    }
    if check is not None:
        record["verify"] = {
            **check.comparison.as_dict(),
            "target_alone": check.plain.stats.as_dict(),
        }
    return record
