"""`specdec chat`: a conversation, tokens coloured by who produced them."""

from __future__ import annotations

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
from .shared import SharedOptions, drafting_mode, resolve_models


@app.command()
def chat(
    draft: DraftOpt = None,
    target: TargetOpt = None,
    models: ModelsFileOpt = None,
    offline: OfflineOpt = False,
    system: SystemOpt = None,
    temp: TempOpt = DEFAULT_TEMP,
    top_k: TopKOpt = DEFAULT_TOP_K,
    top_p: TopPOpt = DEFAULT_TOP_P,
    min_p: MinPOpt = DEFAULT_MIN_P,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    presence_penalty: PresencePenaltyOpt = 0.0,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 512,
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
    no_color: Annotated[
        bool, typer.Option("--no-color", help="No colours (the NO_COLOR variable does the same).")
    ] = False,
    history: HistoryOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Talk with the target, drafted for by the drafter; tokens coloured by who produced them.

    With stdin not a terminal, each line is one message and the replies print plain.
    """
    from ..commands.chat_loop import ChatRequest, run_chat

    shared = SharedOptions.given(locals())

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
