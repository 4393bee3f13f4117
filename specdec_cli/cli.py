"""The Typer app: parse options, build objects, call the engine and the renderer. Wiring only."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from . import render
from .decoding.history import DEFAULT_HISTORY_TOKENS
from .decoding.modes import DrafterMode, default_draft_max
from .decoding.policy import ADAPTIVE_DRAFT_LIMIT
from .decoding.sampling import SamplingSettings
from .decoding.verification import SamplingRule
from .errors import EXIT_INTERRUPTED, BadUsageError, SpecdecError
from .llama import rpc
from .network import is_loopback
from .request import DecodeRequest, HardwareOptions
from .services.tool_calls import Function, chosen_functions, forced_call, read_tools
from .structured import (
    Structure,
    StructureKind,
    read_structure_file,
    structure_from_file,
)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Exact speculative decoding for local GGUF models on llama.cpp.",
    # Click's plain help: name and description, the text wrapped in what is left of the
    # terminal. Rich's panels add a type column and left serve's help a 20-column text at 80.
    rich_markup_mode=None,
)

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader left

# Options shared by run, chat and bench.
DraftOpt = Annotated[
    str | None, typer.Option("--draft", "-d", help="Drafter: a registry name, alias or GGUF path.")
]
TargetOpt = Annotated[
    str | None, typer.Option("--target", "-t", help="Target: a registry name, alias or GGUF path.")
]
ModelsFileOpt = Annotated[
    Path | None, typer.Option("--models", help="Extra models.yaml with your own entries.")
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Never download; use local files only.")
]
SystemOpt = Annotated[str | None, typer.Option("--system", help="System message.")]
RawOpt = Annotated[bool, typer.Option("--raw", help="Send the prompt as-is, no chat template.")]
TempOpt = Annotated[float, typer.Option("--temp", min=0.0, help="Temperature; 0 is greedy.")]
TopKOpt = Annotated[
    int, typer.Option("--top-k", min=0, help="Keep the k likeliest tokens (0: all).")
]
TopPOpt = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus mass to keep.")]
MinPOpt = Annotated[
    float, typer.Option("--min-p", min=0.0, max=1.0, help="Drop tokens below min-p x the top one.")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for sampling.")]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")
]
StopOpt = Annotated[
    list[str] | None, typer.Option("--stop", help="Stop at this string (repeatable).")
]
DraftMaxOpt = Annotated[
    int | None,
    typer.Option(
        "--draft-max",
        min=1,
        max=ADAPTIVE_DRAFT_LIMIT,
        help=f"Most tokens drafted per round (default: 8 fixed, else {ADAPTIVE_DRAFT_LIMIT}).",
    ),
]
HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        envvar="SPECDEC_HISTORY",
        file_okay=False,
        help="Keep prompts and answers in this folder and draft from them in later runs "
        "(text is stored only when asked; `specdec history` shows and clears it).",
    ),
]
NoDraftOpt = Annotated[
    bool,
    typer.Option("--no-draft", help="The target alone, through the same code, for comparison."),
]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", min=1, help="CPU threads.")]
CtxOpt = Annotated[
    int | None,
    typer.Option(
        "--ctx-size",
        "-c",
        min=64,
        help="Context size in tokens (default: what the prompt and answer need, at least 1024, "
        "at most the model's trained length; 4096 for chat, 8192 for serve).",
    ),
]
GpuLayersOpt = Annotated[
    int, typer.Option("--gpu-layers", "-ngl", help="Target layers to offload to the GPU (-1: all).")
]
DraftGpuLayersOpt = Annotated[
    int, typer.Option("--draft-gpu-layers", help="Drafter layers to offload to the GPU (-1: all).")
]


def _check_endpoints(text: str | None) -> str | None:
    """Malformed --rpc is refused while parsing, before any model is looked up."""
    if text:
        try:
            rpc.parse_endpoints(text)
        except BadUsageError as error:
            raise typer.BadParameter(str(error)) from None
    return text


RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        envvar="SPECDEC_RPC",
        callback=_check_endpoints,
        metavar="HOST:PORT,...",
        help="Put the target's layers on these workers (`specdec worker` on each machine); "
        "the drafter stays on this one.",
    ),
]
TensorSplitOpt = Annotated[
    str | None,
    typer.Option(
        "--tensor-split",
        metavar="SHARES",
        help="With --rpc: each worker's share of the target's layers, e.g. 3,1 (default: by "
        "free memory).",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Draft by token ids even where the vocabularies differ (else by text).",
    ),
]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact/--fast",
        help="exact (default): the target checks drafts with batch-invariant kernels, so the "
        "answer is byte for byte the target alone's; fast: llama.cpp's default kernels, "
        "cheaper long verifications, answers may part from the target alone at near-ties.",
    ),
]
RuleOpt = Annotated[
    SamplingRule,  # Typer refuses other values while parsing, before any model is fetched
    typer.Option(
        "--rule",
        case_sensitive=False,
        help="With --temp > 0: invariant (default) gives the same answer for a seed with or "
        "without a drafter; classic (rejection sampling) keeps more drafts, exact only in "
        "distribution.",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own log.")]
DrafterModeOpt = Annotated[
    DrafterMode,  # Typer refuses other values while parsing, before any model is fetched
    typer.Option(
        "--drafter",
        case_sensitive=False,
        metavar="<mode>",
        help="combined: n-gram lookup, else the draft model, each round's length chosen from "
        "measured costs; model: the draft model, adaptive; ngram: prompt lookup, no draft "
        "model; fixed: the draft model, always --draft-max tokens; none: the target alone "
        "(as --no-draft).",
    ),
]


@contextmanager
def user_errors():
    """Known problems become one line on stderr and a meaningful exit code."""
    try:
        yield
    except SpecdecError as error:
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        render.stderr_console().print(f"[bold red]error:[/bold red] {error}", soft_wrap=True)
        raise typer.Exit(error.exit_code) from None
    except KeyboardInterrupt:
        render.stderr_console().print("[yellow]interrupted[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # stdout's reader went away (`| head`): stop quietly, as Unix tools do
        _discard_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a file descriptor (tests capture stdout)
        pass


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
    from .services.prompting import read_prediction

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
    from . import render_fetch
    from .models.registry import load_registry
    from .models.resolve import pick_drafter, resolve_model

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
    from . import render_fetch
    from .models.resolve import resolve_model

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
    """The options run, chat and serve share, by name: taken from each command's own
    arguments (`of(locals())`), so a renamed or missing flag fails that command's first
    call (every command's CLI tests make one), not a silent default."""

    system: str | None
    temp: float
    top_k: int
    top_p: float
    min_p: float
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
    def of(cls, arguments: dict) -> SharedOptions:
        """From a command's arguments (its `locals()`), each field by its name."""
        return cls(**{option.name: arguments[option.name] for option in fields(cls)})

    def hardware(self) -> HardwareOptions:
        """Checked first, before any model is looked up (a bad --tensor-split fetches nothing)."""
        return hardware_options(vars(self))

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


def hardware_options(arguments: Mapping[str, Any]) -> HardwareOptions:
    """--ctx-size, --threads, the GPU layers, --verbose, --exact, --rpc and --tensor-split,
    from a command's arguments by their names (its `locals()`), checked."""
    rpc_text, split_text = arguments["rpc"], arguments["tensor_split"]
    workers = rpc.parse_endpoints(rpc_text) if rpc_text else ()
    if split_text and not workers:
        raise BadUsageError("--tensor-split shares the target among --rpc workers.", "Add --rpc.")
    shares = rpc.parse_tensor_split(split_text, len(workers)) if split_text else ()
    return HardwareOptions(
        ctx_size=arguments["ctx_size"],
        threads=arguments["threads"],
        gpu_layers=arguments["gpu_layers"],
        draft_gpu_layers=arguments["draft_gpu_layers"],
        verbose=arguments["verbose"],
        exact=arguments["exact"],
        rpc=workers,
        tensor_split=shares,
    )


@app.command()
def run(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; piped stdin is appended.")
    ] = None,
    draft: DraftOpt = None,
    target: TargetOpt = None,
    models: ModelsFileOpt = None,
    offline: OfflineOpt = False,
    system: SystemOpt = None,
    raw: RawOpt = False,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    stop: StopOpt = None,
    draft_max: DraftMaxOpt = None,
    drafter: DrafterModeOpt = DrafterMode.COMBINED,
    no_draft: NoDraftOpt = False,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = True,
    rule: RuleOpt = SamplingRule.INVARIANT,
    verify: Annotated[
        bool, typer.Option("--verify", help="Also run the target alone and compare the outputs.")
    ] = False,
    predict: Annotated[
        str | None,
        typer.Option(
            "--predict",
            help="A file the answer is expected to mostly repeat (the code being edited): "
            "drafts follow it, the answer stays the target's. '-' reads it from stdin.",
        ),
    ] = None,
    history: HistoryOpt = None,
    prompt_cache: Annotated[
        Path | None,
        typer.Option(
            "--prompt-cache",
            envvar="SPECDEC_PROMPT_CACHE",
            file_okay=False,
            help="Save the models' state after the prompt in this folder, and start from the "
            "saved state sharing the longest prefix with the next prompt (same answer).",
        ),
    ] = None,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema",
            help="A JSON schema file: the answer is JSON that matches it (exactly the target "
            "alone's answer under it).",
        ),
    ] = None,
    grammar: Annotated[
        Path | None,
        typer.Option("--grammar", help="A GBNF grammar file (llama.cpp's): the answer follows it."),
    ] = None,
    tools: Annotated[
        Path | None,
        typer.Option(
            "--tools",
            help="A JSON file of OpenAI-style tools the model may call; each call it makes is "
            'printed as a JSON line {"name": ..., "arguments": {...}} after any text.',
        ),
    ] = None,
    tool_choice: Annotated[
        str,
        typer.Option(
            "--tool-choice",
            help="auto (the model decides), required (it must call one), none, or a tool's "
            "name (it must call that one): a forced call matches the tool's parameters.",
        ),
    ] = "auto",
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON record.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Answer one prompt; only the answer goes to stdout."""
    from .commands.runner import RunRequest, run_once

    shared = SharedOptions.of(locals())

    with user_errors():
        mode = drafting_mode(drafter, no_draft, draft)
        hardware = shared.hardware()
        functions = read_tools_option(tools, tool_choice, raw)
        structure = read_structure(json_schema, grammar)
        structure = forced_tool_call(functions, tool_choice, structure)
        prediction = read_predict_option(predict, prompt)
        text = read_prompt(prompt, stdin_taken=predict == "-")
        target_path, draft_path = resolve_models(
            target, draft, models=models, offline=offline, needs_draft_model=mode.needs_draft_model
        )
        decode = shared.request(target_path, draft_path, mode, hardware)
        decode = replace(decode, structure=structure)
        offered = tuple(functions) if tool_choice != "none" else ()
        request = RunRequest(decode, text, raw, verify, prediction, history, prompt_cache, offered)
        code = run_once(request, json_output=json_output)
    raise typer.Exit(code)


@app.command()
def pull(
    names: Annotated[
        list[str] | None, typer.Argument(help="Names or aliases (default: the default pair).")
    ] = None,
    models: ModelsFileOpt = None,
    optimize_drafter: Annotated[
        bool,
        typer.Option(
            "--optimize-drafter",
            help="Also build a Q4_0 copy of each drafter pulled (faster on CPUs), measure its "
            "speed and acceptance against the original, and record it in your models.yaml.",
        ),
    ] = False,
    threads: ThreadsOpt = None,
) -> None:
    """Download and verify models; prints NAME<TAB>PATH per model."""
    from . import render_fetch
    from .models.resolve import pull as pull_models

    with user_errors():
        progress = render_fetch.RichFetchProgress()
        pulled = pull_models(names or [], models_file=models, progress=progress)
        render_fetch.print_pulled(pulled)
        if optimize_drafter:
            optimise_pulled_drafters(pulled, models, progress, HardwareOptions(threads=threads))


def optimise_pulled_drafters(pulled, models: Path | None, progress, hardware) -> None:
    from . import render_fetch
    from .commands.tune import optimise_drafter
    from .models.resolve import resolve_model

    drafters = [m for m in pulled if m.entry is not None and m.entry.role == "drafter"]
    if not drafters:
        raise BadUsageError(
            "--optimize-drafter found no drafter among the models pulled.",
            "Name one, e.g. `specdec pull small --optimize-drafter`.",
        )
    target = resolve_model(DEFAULT_TARGET, models_file=models, progress=progress)
    console = render.stderr_console()
    for drafter in drafters:
        with console.status(f"requantising and measuring {drafter.name}…"):
            result = optimise_drafter(drafter, target, hardware, models)
        render.print_optimisation(console, result, target.name)
        render_fetch.print_pulled([resolve_model(result.name, models_file=models)])


@app.command(name="models")
def list_models(
    models: ModelsFileOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    paths: Annotated[bool, typer.Option("--paths", help="Show where each file is.")] = False,
) -> None:
    """List the registry: what is downloaded where, and which drafter fits which target."""
    from . import render_fetch
    from .models.model_status import model_statuses
    from .models.registry import load_registry

    with user_errors():
        statuses = model_statuses(load_registry(models))
        if json_output:
            render_fetch.print_models_json(statuses)
        else:
            render_fetch.print_models_table(statuses, paths=paths)


@app.command(name="history")
def show_history(
    folder: Annotated[
        Path | None,
        typer.Argument(
            envvar="SPECDEC_HISTORY",
            file_okay=False,
            help="The --history folder (default: $SPECDEC_HISTORY).",
            show_default=False,
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Delete the stored prompts and answers.")
    ] = False,
) -> None:
    """Show what a --history folder holds (or clear it)."""
    from .services import history_file as history

    with user_errors():
        if folder is None:
            raise BadUsageError(
                "no history folder given.", "Name one (specdec history DIR) or set SPECDEC_HISTORY."
            )
        if clear:
            cleared = history.clear(folder)
            render.stderr_console().print(f"cleared {cleared} history file(s) in {folder}")
        else:
            render.print_history(render.stdout_console(), folder, history.summarize(folder))


@app.command()
def chat(
    draft: DraftOpt = None,
    target: TargetOpt = None,
    models: ModelsFileOpt = None,
    offline: OfflineOpt = False,
    system: SystemOpt = None,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 512,
    stop: StopOpt = None,
    draft_max: DraftMaxOpt = None,
    drafter: DrafterModeOpt = DrafterMode.COMBINED,
    no_draft: NoDraftOpt = False,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = True,
    rule: RuleOpt = SamplingRule.INVARIANT,
    no_color: Annotated[
        bool, typer.Option("--no-color", help="No colours (the NO_COLOR variable does the same).")
    ] = False,
    history: HistoryOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Talk with the target, drafted for by the drafter; tokens coloured by who produced them.

    With stdin not a terminal, each line is one message and the replies print plain.
    """
    from .commands.chat_loop import ChatRequest, run_chat

    shared = SharedOptions.of(locals())

    with user_errors():
        mode = drafting_mode(drafter, no_draft, draft)
        hardware = shared.hardware()
        target_path, draft_path = resolve_models(
            target, draft, models=models, offline=offline, needs_draft_model=mode.needs_draft_model
        )
        decode = shared.request(target_path, draft_path, mode, hardware)
        request = ChatRequest(decode, no_color=no_color, history=history)
        code = run_chat(request)
    raise typer.Exit(code)


@app.command()
def serve(
    draft: DraftOpt = None,
    target: TargetOpt = None,
    models: ModelsFileOpt = None,
    offline: OfflineOpt = False,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; any but loopback opens the API.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one).")
    ] = 8080,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            envvar="SPECDEC_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every request. Repeat it for several "
            "clients: each key's requests draft only from that key's history.",
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            envvar="SPECDEC_ALLOWED_ORIGINS",
            help="A web page origin (scheme://host:port) that may call the API, with CORS; '*' "
            "for any. Repeatable. Without it, requests that carry an Origin are refused.",
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            envvar="SPECDEC_ALLOWED_HOSTS",
            help="A Host name a loopback server answers besides localhost and 127.0.0.1 "
            "(behind a proxy). Repeatable.",
        ),
    ] = None,
    max_queue: Annotated[
        int,
        typer.Option("--max-queue", min=1, help="Requests that may wait; more get a 503."),
    ] = 16,
    json_log: Annotated[
        bool, typer.Option("--json-log", help="Log one JSON object per request on stderr.")
    ] = False,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            "-np",
            min=1,
            max=MAX_PARALLEL,
            help="Requests answered side by side, their tokens sharing each pass of the "
            "target; each answer stays the one it gets alone (exact mode).",
        ),
    ] = 1,
    history_tokens: Annotated[
        int,
        typer.Option(
            "--history-tokens",
            min=0,
            help="Earlier prompts and answers kept in memory to draft from, in tokens "
            "(0: none). Never written to disk.",
        ),
    ] = DEFAULT_HISTORY_TOKENS,
    system: Annotated[
        str | None,
        typer.Option("--system", help="System message for requests that send none."),
    ] = None,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: Annotated[
        int,
        typer.Option("--max-tokens", "-n", min=1, help="Most tokens for requests that set none."),
    ] = 2048,
    stop: StopOpt = None,
    draft_max: DraftMaxOpt = None,
    drafter: DrafterModeOpt = DrafterMode.COMBINED,
    no_draft: NoDraftOpt = False,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = True,
    rule: RuleOpt = SamplingRule.INVARIANT,
    verbose: VerboseOpt = False,
) -> None:
    """Serve OpenAI's API (chat completions, completions, models) on one loaded pair.

    The sampling options are defaults for requests that do not set their own.
    """
    from .serve.server import ServeOptions, ServeRequest
    from .serve.server import serve as run_server

    shared = SharedOptions.of(locals())

    with user_errors():
        if parallel > 1 and rpc:  # before any model is resolved (or downloaded)
            raise SpecdecError("--parallel with --rpc is not supported yet.", "Drop one of them.")
        mode = drafting_mode(drafter, no_draft, draft)
        hardware = replace(shared.hardware(), one_decode_thread=True)
        target_path, draft_path = resolve_models(
            target, draft, models=models, offline=offline, needs_draft_model=mode.needs_draft_model
        )
        decode = shared.request(target_path, draft_path, mode, hardware)
        options = ServeOptions(
            host,
            port,
            keys(api_key),
            max_queue,
            json_log,
            history_tokens,
            parallel,
            allowed_hosts=tuple(allow_host or ()),
            allowed_origins=tuple(allow_origin or ()),
        )
        aliases = (target or DEFAULT_TARGET,)
        code = run_server(ServeRequest(decode, options, aliases))
    raise typer.Exit(code)


@app.command()
def bench(
    draft: DraftOpt = None,
    target: TargetOpt = None,
    models: ModelsFileOpt = None,
    offline: OfflineOpt = False,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help="YAML or JSONL prompts instead of the suite, or 'sessions': requests that "
            "share history (compare combined with combined+history).",
        ),
    ] = None,
    category: Annotated[
        list[str] | None, typer.Option("--category", help="Only these categories (a,b or repeat).")
    ] = None,
    per_category: Annotated[
        int | None, typer.Option("--per-category", min=1, help="First N prompts per category.")
    ] = None,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1, help="Runs per side.")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Warm-up tokens (0: none).")] = 16,
    draft_max: Annotated[
        str | None,
        typer.Option(
            "--draft-max",
            help="Draft length, or a list to sweep: 2,4,8 (default: 8 "
            f"for fixed, {ADAPTIVE_DRAFT_LIMIT} for the adaptive modes).",
        ),
    ] = None,
    drafter: Annotated[
        str,
        typer.Option(
            "--drafter",
            help="Drafting mode, or a list to compare: fixed,model,ngram,combined, oracle (the "
            "ceiling: drafts the target alone's answer); +prediction after an adaptive mode "
            "follows the prompts' predictions.",
        ),
    ] = "combined",
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", "-n", min=1, help="Cap each prompt's max tokens.")
    ] = None,
    system: SystemOpt = None,
    raw: RawOpt = False,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Seed of repeat 0 (then +1 per repeat).")] = 0,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = True,
    rule: RuleOpt = SamplingRule.INVARIANT,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write every number to this file ('-': stdout).")
    ] = None,
    markdown_file: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown report to this file.")
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Target alone against speculative decoding on a prompt suite: speed, acceptance, output."""
    from .bench import bench as bench_lib
    from .bench import bench_configs, bench_prompts, bench_report, render_bench

    with user_errors():
        hardware = hardware_options(locals())
        modes, needs_model = bench_configs.parse_modes(drafter)
        drafts = draft.split(",") if draft else []
        main_draft, extra_drafts = (drafts[0] if drafts else None), drafts[1:]
        target_path, draft_path = resolve_models(
            target, main_draft, models=models, offline=offline, needs_draft_model=needs_model
        )
        request = bench_lib.BenchRequest(
            target=target_path,
            draft=draft_path,
            extra_drafts=resolve_extra_drafts(extra_drafts, models=models, offline=offline),
            prompts=bench_prompts.select_prompts(
                bench_prompts.load_prompts(prompts), category or (), per_category
            ),
            configurations=bench_configs.configurations(
                bench_configs.parse_int_list(draft_max, "--draft-max", ADAPTIVE_DRAFT_LIMIT)
                if draft_max
                else None,
                modes,
                [draft_label(name) for name in extra_drafts],
                exact=exact,
            ),
            prompts_source=str(prompts) if prompts else "built-in suite",
            repeats=repeats,
            warmup_tokens=warmup,
            max_tokens=max_tokens,
            sampling=SamplingSettings(temp, top_k, top_p, min_p),
            seed=seed,
            raw=raw,
            system=system,
            hardware=hardware,
            force_incompatible=force,
            rule=rule,
        )
        bench_report.check_output_paths(json_file, markdown_file)
        with render_bench.progress_display() as progress:
            report = bench_lib.run_bench(request, progress)
        if json_file is not None:
            bench_report.write_json(report, json_file)
        if markdown_file is not None:
            markdown_file.write_text(render_bench.markdown(report), encoding="utf-8")
        render_bench.show_report(report, json_path=json_file, markdown_path=markdown_file)
    raise typer.Exit(report.exit_code)


def keys(given: list[str] | None) -> tuple[str, ...]:
    """--api-key as given, blank ones left out (an unset variable in a script)."""
    return tuple(key for key in given or () if key.strip())


@app.command()
def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The IPv4 address to listen on: 127.0.0.1 (default) is this machine only; "
            "anything else lets whoever reaches it use this machine (no authentication).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The TCP port to listen on.")] = (
        rpc.DEFAULT_PORT
    ),
    threads: ThreadsOpt = None,
    tensor_cache: Annotated[
        Path | None,
        typer.Option(
            "--tensor-cache",
            file_okay=False,
            help="Keep the weights clients send in this folder, so the next load of the same "
            "model sends hashes instead of gigabytes.",
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Hold a target's layers for specdec on another machine (llama.cpp's RPC backend).

    Clients pass --rpc HOST:PORT. One client at a time; Ctrl-C stops the worker."""
    import signal

    from .llama import devices, library

    with user_errors():
        rpc.check_listen_address(host, port)
        library.set_verbose(verbose)
        if not is_loopback(host):
            render.stderr_console().print(
                f"[bold yellow]warning:[/bold yellow] listening on {host}:{port}. llama.cpp's RPC "
                "protocol has no authentication or encryption: anyone who can reach this port "
                "can use this machine's memory and compute. Only do this on a network you trust, "
                "never on the internet.",
                soft_wrap=True,
            )
        render.stderr_console().print(
            f"specdec worker on {host}:{port}: {', '.join(devices.worker_device_names())}, "
            f"batch-invariant kernels up to {library.EXACT_BATCH_ROWS} rows (exact clients "
            "stay exact). Ctrl-C stops it.",
            soft_wrap=True,
        )
        if tensor_cache is not None:
            tensor_cache.mkdir(parents=True, exist_ok=True)
        # llama.cpp's server loop never returns to Python: let the signals stop the process
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        devices.serve_worker(host, port, threads, tensor_cache)


def main() -> None:
    app()
