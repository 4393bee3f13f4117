"""What LlamaBackend's jobs share: the model, its context and batch, and what is cached in
it. Declared once here for the modules that each hold one job (backend.py, sequences.py,
vocabulary.py); LlamaBackend sets them (backend.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .rounds import Rounds


class ContextState:
    path: Path
    exact: bool
    _model: Any  # llama_model *
    _vocab: Any  # llama_vocab *
    _ctx: Any  # llama_context *
    _memory: Any  # llama_memory_t
    _batch: Any  # llama_batch, and numpy views of its arrays:
    _batch_token: np.ndarray
    _batch_pos: np.ndarray
    _batch_logits: np.ndarray
    n_vocab: int
    n_ctx: int  # this sequence's share of the context
    n_batch: int
    _n_batch_wanted: int
    cached: list[int]  # the tokens in this sequence's KV cache, in order
    truncations: int  # of `cached`, which otherwise only grows
    _aligned_prompt_end: int
    tokens_decoded: int
    decode_seconds: float
    decode_calls: int
    _seq: int  # this backend's KV sequence in the context
    _owns_model: bool
    _owns_context: bool
    _children: list[Any]  # the views of a split context
    _rounds: Rounds | None
    _pool: int
    _turn: Callable[[], AbstractContextManager]
    _characters: dict[int, str] | None
    _pieces: dict[int, bytes]
    _spellings: dict[int, bytes]
    _wants_device_choices: bool  # greedy choices by the device of the logits, where it can
    _eog: dict[int, bool]

    def _open_context(self, n_ctx: int, n_sequences: int = 1, unified: bool = False) -> None:
        raise NotImplementedError

    def _close_context(self) -> None:
        raise NotImplementedError

    def _init_batch(self) -> None:
        raise NotImplementedError
