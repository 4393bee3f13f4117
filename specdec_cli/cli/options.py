"""The options several commands take, each declared once with its help and its default."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..decoding.modes import DrafterMode
from ..decoding.penalties import PENALTY_RANGE
from ..decoding.policy import ADAPTIVE_DRAFT_LIMIT
from ..decoding.verification import SamplingRule
from ..errors import BadUsageError
from ..llama import rpc

# Defaults of the options several commands take, each written here only (llama.cpp's sampling
# defaults; greedy by default; everything on the CPU unless asked; exact mode).
DEFAULT_TEMP = 0.0
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_GPU_LAYERS = 0
DEFAULT_EXACT = True
DEFAULT_RULE = SamplingRule.INVARIANT
DEFAULT_DRAFTER = DrafterMode.COMBINED

# Options shared by run, chat, serve and bench.
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


def _penalty_option(flag: str, help: str) -> Any:
    return typer.Option(
        flag,
        min=PENALTY_RANGE[0],
        max=PENALTY_RANGE[1],
        metavar="<float>",  # the range is in the help: "<float range>" widens every column
        help=help,
    )


FrequencyPenaltyOpt = Annotated[
    float,
    _penalty_option(
        "--frequency-penalty",
        "Lower each token's logit by this for every time the answer has used it (OpenAI's).",
    ),
]
PresencePenaltyOpt = Annotated[
    float,
    _penalty_option(
        "--presence-penalty",
        "Lower each token's logit by this once the answer has used it (OpenAI's).",
    ),
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
