"""Turning options into loaded models and prompt tokens: the steps every command shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .adaptive import CostModel
from .backend import Backend
from .compat import check_compatible
from .errors import ContextOverflowError


@dataclass(frozen=True)
class HardwareOptions:
    ctx_size: int = 4096
    threads: int | None = None
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    verbose: bool = False


@dataclass
class ModelPair:
    target: Backend
    drafter: Backend | None
    costs: CostModel | None = None  # decode timings on this machine, once measured

    def reset(self) -> None:
        for backend in (self.target, self.drafter):
            if backend is not None:
                backend.truncate(0)


def load_pair(
    target_path: Path,
    draft_path: Path | None,
    hardware: HardwareOptions,
    force_incompatible: bool = False,
) -> ModelPair:
    from . import llama_backend  # imported late: loading llama.cpp takes a moment

    llama_backend.set_verbose(hardware.verbose)
    target = llama_backend.LlamaBackend(
        target_path,
        n_ctx=hardware.ctx_size,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.gpu_layers,
    )
    if draft_path is None:
        return ModelPair(target, None)
    drafter = llama_backend.LlamaBackend(
        draft_path,
        n_ctx=hardware.ctx_size,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.draft_gpu_layers,
    )
    if not force_incompatible:
        check_compatible(target, drafter)
    return ModelPair(target, drafter)


def chat_messages(user_text: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user_text}]


def prompt_tokens(target, text: str, *, system: str | None, raw: bool) -> list[int]:
    """Raw text as-is (with the model's BOS), or the user message through the chat template."""
    if raw:
        return target.tokenize(text, add_special=True)
    rendered = target.format_chat(chat_messages(text, system))
    return target.tokenize(rendered, add_special=False, parse_special=True)


def check_prompt_fits(prompt: list[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}.",
            "Raise --ctx-size or shorten the input.",
        )
