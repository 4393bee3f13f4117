"""What run, chat, serve and bench do with their options before any model is loaded:
check them, read the files they name, resolve the models, build the request."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from .. import render
from ..decoding.modes import DrafterMode, default_draft_max
from ..decoding.penalties import Penalties
from ..decoding.sampling import SamplingSettings
from ..decoding.verification import SamplingRule
from ..errors import BadUsageError
from ..llama import rpc
from ..request import DecodeRequest, HardwareOptions
from ..services.tool_calls import Function, chosen_functions, forced_call, read_tools
from ..structured import Structure, StructureKind, read_structure_file, structure_from_file


def read_prompt(argument: str | None, stdin_taken: bool = False) -> str:
    """The argument, then piped stdin after it (unless --predict - took stdin)."""
    parts = [argument] if argument else []
    if not stdin_taken and not sys.stdin.isatty():
        piped = sys.stdin.read()
        if piped.strip():
            parts.append(piped)
    if not parts:
        raise BadUsageError(
            "no prompt given.", 'Pass it as an argument (specdec run "...") or pipe it on stdin.'
        )
    return "\n\n".join(parts)


def read_predict_option(predict: str | None, prompt: str | None) -> str | None:
    from ..services.prompting import read_prediction

    if predict is None:
        return None
    if predict != "-":
        return read_prediction(Path(predict))
    if not prompt:
        raise BadUsageError(
            "--predict - reads the prediction from stdin, so the prompt must be an argument.",
            'Pass it as one: specdec run "edit this" --predict - < file.py',
        )
    text = sys.stdin.read()
    if not text.strip():
        raise BadUsageError("--predict - read nothing from stdin.", "Pipe the file in.")
    return text


DEFAULT_TARGET = "large"
# serve --parallel: each slot may verify up to 64 rows a pass (llama/library.py's
# EXACT_BATCH_ROWS), and eight of them fill llama.cpp's default 512-row batch.
MAX_PARALLEL = 8


def drafting_mode(drafter: DrafterMode, no_draft: bool, draft: str | None) -> DrafterMode:
    """The drafting mode run, chat and serve use (NONE: the target alone), once the
    options are known not to contradict each other: a flag that would be silently ignored
    is refused with how to fix it."""
    if draft and no_draft:
        raise BadUsageError(
            "--draft and --no-draft contradict each other.", "Give only one of them."
        )
    if draft and drafter == DrafterMode.NGRAM:
        raise BadUsageError(
            "--drafter ngram drafts without a model, so --draft would be ignored.",
            "Drop --draft, or use --drafter combined to draft with both.",
        )
    if draft and drafter == DrafterMode.NONE:
        raise BadUsageError(
            "--drafter none is the target alone, so --draft would be ignored.",
            "Drop --draft, or choose a --drafter that drafts (combined, model or fixed).",
        )
    return DrafterMode.NONE if no_draft else drafter


def resolve_models(
    target: str | None,
    draft: str | None,
    *,
    models: Path | None,
    offline: bool,
    needs_draft_model: bool,
) -> tuple[Path, Path | None]:
    """Registry names, aliases or paths -> local files (pulled first when missing).

    Neither means the registry's default pair; --target alone, the smallest drafter in the
    registry that shares its vocabulary (when the drafting mode needs a draft model)."""
    from .. import render_fetch
    from ..models.registry import load_registry
    from ..models.resolve import pick_drafter, resolve_model

    progress = render_fetch.RichFetchProgress()
    resolve = partial(resolve_model, models_file=models, offline=offline, progress=progress)
    resolved = resolve(target or DEFAULT_TARGET)
    if not needs_draft_model:
        return resolved.path, None
    if not draft and not target:
        draft = load_registry(models).default_draft
    if draft:
        return resolved.path, resolve(draft).path
    picked = pick_drafter(resolved, models_file=models, offline=offline, progress=progress)
    render.stderr_console().print(
        f"[dim]drafter: {picked.name} (the smallest compatible model for {resolved.name})[/dim]"
    )
    return resolved.path, picked.path


def resolve_extra_drafts(
    names: list[str], *, models: Path | None, offline: bool
) -> dict[str, Path]:
    """More drafters for bench to compare, by label."""
    from .. import render_fetch
    from ..models.resolve import resolve_model

    progress = render_fetch.RichFetchProgress()
    return {
        draft_label(name): resolve_model(
            name, models_file=models, offline=offline, progress=progress
        ).path
        for name in names
    }


def draft_label(name: str) -> str:
    return Path(name).stem if name.endswith(".gguf") else name


@dataclass(frozen=True)
class SharedOptions:
    """The options run, chat and serve share, as each command was given them."""

    system: str | None
    temp: float
    top_k: int
    top_p: float
    min_p: float
    frequency_penalty: float
    presence_penalty: float
    seed: int | None
    max_tokens: int
    stop: list[str] | None
    draft_max: int | None
    threads: int | None
    ctx_size: int | None
    gpu_layers: int
    draft_gpu_layers: int
    rpc: str | None
    tensor_split: str | None
    force: bool
    exact: bool
    rule: SamplingRule
    verbose: bool

    @classmethod
    def given(cls, arguments: Mapping[str, Any]) -> SharedOptions:
        """Picked out of a command's arguments (its `locals()`), which name every field: the
        options are declared per command for typer, and gathered here once."""
        return cls(**{field.name: arguments[field.name] for field in fields(cls)})

    def hardware(self) -> HardwareOptions:
        """Checked first, before any model is looked up (a bad --tensor-split fetches nothing)."""
        return hardware_options(
            ctx_size=self.ctx_size,
            threads=self.threads,
            gpu_layers=self.gpu_layers,
            draft_gpu_layers=self.draft_gpu_layers,
            verbose=self.verbose,
            exact=self.exact,
            rpc_endpoints=self.rpc,
            tensor_split=self.tensor_split,
        )

    def request(
        self,
        target_path: Path,
        draft_path: Path | None,
        mode: DrafterMode,
        hardware: HardwareOptions,
    ) -> DecodeRequest:
        return DecodeRequest(
            target=target_path,
            draft=draft_path,
            drafter_mode=mode,
            system=self.system,
            sampling=SamplingSettings(self.temp, self.top_k, self.top_p, self.min_p),
            penalties=Penalties(self.frequency_penalty, self.presence_penalty),
            seed=self.seed,
            max_tokens=self.max_tokens,
            stop=tuple(self.stop or ()),
            draft_max=self.draft_max or default_draft_max(mode),
            hardware=hardware,
            force_incompatible=self.force,
            rule=self.rule,
        )


def read_structure(json_schema: Path | None, grammar: Path | None) -> Structure | None:
    """--json-schema or --grammar, read and checked (one of them at most)."""
    if json_schema is not None and grammar is not None:
        raise BadUsageError("--json-schema and --grammar both constrain the answer.", "Give one.")
    if json_schema is not None:
        return structure_from_file(StructureKind.JSON_SCHEMA, json_schema, "--json-schema")
    if grammar is not None:
        return structure_from_file(StructureKind.GRAMMAR, grammar, "--grammar")
    return None


def read_tools_option(path: Path | None, choice: str, raw: bool) -> list[Function]:
    """--tools, read and checked, and --tool-choice checked against it."""
    if path is None:
        if choice != "auto":
            raise BadUsageError("--tool-choice chooses among --tools.", "Add --tools FILE.")
        return []
    if raw:
        raise BadUsageError(
            "--tools are rendered by the chat template, which --raw leaves out.", "Drop one."
        )
    functions = read_tools(read_structure_file(path, "--tools"), f"--tools {path}")
    names = [f.name for f in functions]
    if choice not in ("auto", "none", "required", *names):
        raise BadUsageError(
            f"--tool-choice {choice} is none of auto, none, required or a tool in {path}.",
            f"Tools there: {', '.join(names)}.",
        )
    return functions


def check_fill_in_middle(suffix: str | None, system: str | None, tools: Path | None) -> None:
    """--suffix lays out raw text with fill-in-the-middle tokens: no chat template."""
    if suffix is None:
        return
    for given, option in ((system, "--system"), (tools, "--tools")):
        if given is not None:
            raise BadUsageError(
                f"--suffix fills in the middle of raw text, but {option} needs the chat template.",
                "Drop one.",
            )


def forced_tool_call(
    functions: list[Function], choice: str, structure: Structure | None
) -> Structure | None:
    """The grammar of a call that must be made (--tool-choice required or a name)."""
    forced = chosen_functions(functions, choice)
    if not forced:
        return structure
    if structure is not None:
        raise BadUsageError(
            f"--tool-choice {choice} and --{structure.kind.value.replace('_', '-')} both "
            "constrain the answer.",
            "Give one.",
        )
    return forced_call(forced)


def hardware_options(
    *,
    ctx_size: int | None,
    threads: int | None,
    gpu_layers: int,
    draft_gpu_layers: int,
    verbose: bool,
    exact: bool,
    rpc_endpoints: str | None,
    tensor_split: str | None,
) -> HardwareOptions:
    """--ctx-size, --threads, the GPU layers, --verbose, --exact, --rpc and --tensor-split,
    checked."""
    workers = rpc.parse_endpoints(rpc_endpoints) if rpc_endpoints else ()
    if tensor_split and not workers:
        raise BadUsageError("--tensor-split shares the target among --rpc workers.", "Add --rpc.")
    shares = rpc.parse_tensor_split(tensor_split, len(workers)) if tensor_split else ()
    return HardwareOptions(
        ctx_size=ctx_size,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        verbose=verbose,
        exact=exact,
        rpc=workers,
        tensor_split=shares,
    )
