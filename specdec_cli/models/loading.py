"""Loading the models a request names, and sizing their contexts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..decoding.backend import Backend
from ..decoding.costs import CostModel
from ..request import DecodeRequest, HardwareOptions
from .compat import vocabulary_difference

ALL_LAYERS = 999  # n_gpu_layers: every layer on the devices given (a target on RPC workers)


@dataclass
class ModelPair:
    target: Backend
    drafter: Backend | None
    costs: CostModel | None = None  # decode timings on this machine, once measured
    # More drafters to compare (bench): name -> (backend, its costs once measured)
    alternates: dict[str, tuple[Backend, CostModel | None]] = field(default_factory=dict)
    # Drafters of another vocabulary than the target's: they draft by text (text_drafter).
    text_drafters: list[Backend] = field(default_factory=list)

    def drafts_by_text(self, drafter: Backend | None) -> bool:
        return any(drafter is backend for backend in self.text_drafters)

    def add_drafter(self, drafter: Backend, by_text: bool, name: str | None = None) -> None:
        """The pair's drafter, or with `name` one more to compare (bench)."""
        if name is None:
            self.drafter = drafter
        else:
            self.alternates[name] = (drafter, None)
        if by_text:
            self.text_drafters.append(drafter)

    def backends(self) -> list[Backend]:
        others = [backend for backend, _ in self.alternates.values()]
        return [b for b in (self.target, self.drafter, *others) if b is not None]

    def reset(self) -> None:
        for backend in self.backends():
            backend.truncate(0)

    def close(self) -> None:
        for backend in self.backends():
            backend.close()


class ModelLoader(Protocol):
    """Opens a model file as a Backend: llama.cpp (load_with_llama_cpp) or, in tests, a fake."""

    def __call__(
        self, path: Path, *, drafter: bool, n_ctx: int, hardware: HardwareOptions
    ) -> Backend: ...


def load_with_llama_cpp(
    path: Path, *, drafter: bool, n_ctx: int, hardware: HardwareOptions
) -> Backend:
    from ..llama import backend, devices, library  # imported late: loading llama.cpp takes a moment

    library.set_verbose(hardware.verbose)
    if hardware.one_decode_thread:
        library.decode_on_one_thread()
    if drafter:
        return backend.LlamaBackend(
            path,
            n_ctx=n_ctx,
            n_threads=hardware.threads,
            n_gpu_layers=hardware.draft_gpu_layers,
            # beside a target on workers, this machine's devices: a drafter's passes cost
            # no round trips
            devices=devices.local_devices() if hardware.rpc else None,
        )
    return backend.LlamaBackend(
        path,
        n_ctx=n_ctx,
        n_threads=hardware.threads,
        n_gpu_layers=hardware.gpu_layers or (ALL_LAYERS if hardware.rpc else 0),
        exact=hardware.exact,
        devices=devices.WORKERS.devices(hardware.rpc) if hardware.rpc else None,
        tensor_split=hardware.tensor_split,
    )


def load_pair(
    target_path: Path,
    draft_path: Path | None,
    hardware: HardwareOptions,
    force_incompatible: bool = False,
    loader: ModelLoader = load_with_llama_cpp,
) -> ModelPair:
    n_ctx = hardware.ctx_size or MIN_CONTEXT
    target = loader(target_path, drafter=False, n_ctx=n_ctx, hardware=hardware)
    pair = ModelPair(target, None)
    fit_context(pair, hardware, MIN_CONTEXT)  # only a model trained on less changes
    if draft_path is not None:
        pair.add_drafter(*load_drafter(target, draft_path, hardware, force_incompatible, loader))
    return pair


def load_models(request: DecodeRequest, loader: ModelLoader = load_with_llama_cpp) -> ModelPair:
    return load_pair(
        request.target, request.draft, request.hardware, request.force_incompatible, loader
    )


MIN_CONTEXT = 1024
CHAT_CONTEXT = 4096  # a conversation grows: room for several exchanges
CONTEXT_STEP = 256  # llama.cpp pads contexts to this


def fit_context(pair: ModelPair, hardware: HardwareOptions, needed: int) -> None:
    """Unless --ctx-size was given, contexts of `needed` tokens: rounded up, at least
    MIN_CONTEXT, but never longer than the target was trained for."""
    if hardware.ctx_size is not None:
        return
    n_ctx = context_size(needed, pair.target.n_ctx_train)
    for backend in pair.backends():
        if backend.n_ctx != n_ctx:
            backend.resize_context(n_ctx)


def context_size(needed: int, trained: int) -> int:
    rounded = -(-max(needed, MIN_CONTEXT) // CONTEXT_STEP) * CONTEXT_STEP
    return min(rounded, trained) if trained > 0 else rounded


def load_drafter(
    target: Backend,
    draft_path: Path,
    hardware: HardwareOptions,
    force_incompatible: bool = False,
    loader: ModelLoader = load_with_llama_cpp,
) -> tuple[Backend, bool]:
    """The drafter, and whether it drafts by text: its vocabulary is not the target's (and
    `force_incompatible` does not ask for drafting by token ids all the same)."""
    # the drafter follows the target through the same text: the same context
    drafter = loader(draft_path, drafter=True, n_ctx=target.n_ctx, hardware=hardware)
    by_text = not force_incompatible and vocabulary_difference(target, drafter) is not None
    return drafter, by_text
