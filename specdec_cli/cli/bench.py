"""`specdec bench`: the target alone against speculative configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..decoding.policy import ADAPTIVE_DRAFT_LIMIT
from ..decoding.sampling import SamplingSettings
from .app import app, user_errors
from .options import (
    DEFAULT_EXACT,
    DEFAULT_GPU_LAYERS,
    DEFAULT_MIN_P,
    DEFAULT_RULE,
    DEFAULT_TEMP,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    CtxOpt,
    DraftGpuLayersOpt,
    DraftOpt,
    ExactOpt,
    ForceOpt,
    GpuLayersOpt,
    MinPOpt,
    ModelsFileOpt,
    OfflineOpt,
    RawOpt,
    RpcOpt,
    RuleOpt,
    SystemOpt,
    TargetOpt,
    TempOpt,
    TensorSplitOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)
from .shared import draft_label, hardware_options, resolve_extra_drafts, resolve_models


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
    temp: TempOpt = DEFAULT_TEMP,
    top_k: TopKOpt = DEFAULT_TOP_K,
    top_p: TopPOpt = DEFAULT_TOP_P,
    min_p: MinPOpt = DEFAULT_MIN_P,
    seed: Annotated[int, typer.Option("--seed", help="Seed of repeat 0 (then +1 per repeat).")] = 0,
    threads: ThreadsOpt = None,
    ctx_size: CtxOpt = None,
    gpu_layers: GpuLayersOpt = DEFAULT_GPU_LAYERS,
    draft_gpu_layers: DraftGpuLayersOpt = DEFAULT_GPU_LAYERS,
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    force: ForceOpt = False,
    exact: ExactOpt = DEFAULT_EXACT,
    rule: RuleOpt = DEFAULT_RULE,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write every number to this file ('-': stdout).")
    ] = None,
    markdown_file: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown report to this file.")
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Target alone against speculative decoding on a prompt suite: speed, acceptance, output."""
    from ..bench import bench as bench_lib
    from ..bench import bench_configs, bench_prompts, bench_report, render_bench
    from ..bench.bench_request import BenchRequest, shared_request

    with user_errors():
        hardware = hardware_options(
            ctx_size=ctx_size,
            threads=threads,
            gpu_layers=gpu_layers,
            draft_gpu_layers=draft_gpu_layers,
            verbose=verbose,
            exact=exact,
            rpc_endpoints=rpc,
            tensor_split=tensor_split,
        )
        drafters = bench_configs.parse_drafters(drafter)
        drafts = draft.split(",") if draft else []
        main_draft, extra_drafts = (drafts[0] if drafts else None), drafts[1:]
        target_path, draft_path = resolve_models(
            target,
            main_draft,
            models=models,
            offline=offline,
            needs_draft_model=any(d.needs_draft_model for d in drafters),
        )
        decode = shared_request(
            target_path,
            draft_path,
            hardware=hardware,
            sampling=SamplingSettings(temp, top_k, top_p, min_p),
            seed=seed,
            max_tokens=max_tokens,
            system=system,
            force_incompatible=force,
            rule=rule,
        )
        request = BenchRequest(
            decode=decode,
            prompts=bench_prompts.select_prompts(
                bench_prompts.load_prompts(prompts), category or (), per_category
            ),
            configurations=bench_configs.configurations(
                bench_configs.parse_int_list(draft_max, "--draft-max", ADAPTIVE_DRAFT_LIMIT)
                if draft_max
                else None,
                drafters,
                [draft_label(name) for name in extra_drafts],
                exact=exact,
            ),
            extra_drafts=resolve_extra_drafts(extra_drafts, models=models, offline=offline),
            prompts_source=str(prompts) if prompts else "built-in suite",
            repeats=repeats,
            warmup_tokens=warmup,
            raw=raw,
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
