"""`specdec run`: one answer, for pipelines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from .app import app, user_errors
from .options import (
    DEFAULT_DRAFTER,
    DEFAULT_EXACT,
    DEFAULT_GPU_LAYERS,
    DEFAULT_MIN_P,
    DEFAULT_RULE,
    DEFAULT_TEMP,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    CtxOpt,
    DrafterModeOpt,
    DraftGpuLayersOpt,
    DraftMaxOpt,
    DraftOpt,
    ExactOpt,
    ForceOpt,
    FrequencyPenaltyOpt,
    GpuLayersOpt,
    HistoryOpt,
    MaxTokensOpt,
    MinPOpt,
    ModelsFileOpt,
    NoDraftOpt,
    OfflineOpt,
    PresencePenaltyOpt,
    RawOpt,
    RpcOpt,
    RuleOpt,
    SeedOpt,
    StopOpt,
    SystemOpt,
    TargetOpt,
    TempOpt,
    TensorSplitOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)
from .shared import (
    SharedOptions,
    check_fill_in_middle,
    drafting_mode,
    forced_tool_call,
    read_predict_option,
    read_prompt,
    read_structure,
    read_tools_option,
    resolve_models,
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
    temp: TempOpt = DEFAULT_TEMP,
    top_k: TopKOpt = DEFAULT_TOP_K,
    top_p: TopPOpt = DEFAULT_TOP_P,
    min_p: MinPOpt = DEFAULT_MIN_P,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    presence_penalty: PresencePenaltyOpt = 0.0,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    stop: StopOpt = None,
    draft_max: DraftMaxOpt = None,
    drafter: DrafterModeOpt = DEFAULT_DRAFTER,
    no_draft: NoDraftOpt = False,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = DEFAULT_GPU_LAYERS,
    draft_gpu_layers: DraftGpuLayersOpt = DEFAULT_GPU_LAYERS,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = DEFAULT_EXACT,
    rule: RuleOpt = DEFAULT_RULE,
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
    suffix: Annotated[
        str | None,
        typer.Option(
            "--suffix",
            help="Fill in the middle: the prompt is the code before the gap and this the code "
            "after it (a code model's fill-in-the-middle tokens, no chat template).",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON record.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Answer one prompt; only the answer goes to stdout."""
    from ..commands.runner import RunRequest, run_once

    shared = SharedOptions.given(locals())

    with user_errors():
        mode = drafting_mode(drafter, no_draft, draft)
        hardware = shared.hardware()
        check_fill_in_middle(suffix, system, tools)
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
        request = RunRequest(
            decode, text, raw, verify, prediction, history, prompt_cache, offered, suffix
        )
        code = run_once(request, json_output=json_output)
    raise typer.Exit(code)
