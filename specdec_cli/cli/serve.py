"""`specdec serve`: OpenAI's API on one loaded pair."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from ..decoding.history import DEFAULT_HISTORY_TOKENS
from ..errors import SpecdecError
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
    MinPOpt,
    ModelsFileOpt,
    NoDraftOpt,
    OfflineOpt,
    PresencePenaltyOpt,
    RpcOpt,
    RuleOpt,
    SeedOpt,
    StopOpt,
    TargetOpt,
    TempOpt,
    TensorSplitOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)
from .shared import DEFAULT_TARGET, MAX_PARALLEL, SharedOptions, drafting_mode, resolve_models


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
    temp: TempOpt = DEFAULT_TEMP,
    top_k: TopKOpt = DEFAULT_TOP_K,
    top_p: TopPOpt = DEFAULT_TOP_P,
    min_p: MinPOpt = DEFAULT_MIN_P,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    presence_penalty: PresencePenaltyOpt = 0.0,
    seed: SeedOpt = None,
    max_tokens: Annotated[
        int,
        typer.Option("--max-tokens", "-n", min=1, help="Most tokens for requests that set none."),
    ] = 2048,
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
    verbose: VerboseOpt = False,
) -> None:
    """Serve OpenAI's API (chat completions, completions, models) on one loaded pair.

    The sampling options are defaults for requests that do not set their own.
    """
    from ..serve.launch import ServeOptions, ServeRequest
    from ..serve.launch import serve as run_server

    shared = SharedOptions.given(locals())

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


def keys(given: list[str] | None) -> tuple[str, ...]:
    """--api-key as given, blank ones left out (an unset variable in a script)."""
    return tuple(key for key in given or () if key.strip())
