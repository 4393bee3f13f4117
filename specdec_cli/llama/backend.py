"""One GGUF model in llama.cpp, as the engine's `Backend`: its context, decodes and cached
state. Uses the low-level batch API: one `llama_decode` per call with logits requested only
for the rows the engine needs, read in place from llama.cpp's output buffer, and rollback
with `llama_memory_seq_rm`. Its vocabulary and chat template (vocabulary.py) and its several
sequences in one context (sequences.py) are jobs of their own."""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import numpy as np

from ..decoding.backend import ArgmaxRows, Choices, kept_prefix, raise_if_stopped
from ..errors import ContextOverflowError, ModelFileError
from . import library
from .batches import aligned_bounds, chunk_bounds, decode_failure
from .device_choices import DeviceChoices, DeviceSampler, choices_on_device
from .exactness import padded_rows
from .library import (
    DRAFT_ROUND_ROWS,
    EXACT_BATCH_ROWS,
    _llama_decode,
    default_threads,
    invariant_prompts,
    llama_cpp,
)
from .model_file import _load_model, _refuse_inexact_placement
from .rounds import Rounds
from .sequences import SequencesMixin
from .vocabulary import VocabularyMixin


class LlamaBackend(SequencesMixin, VocabularyMixin):
    """One GGUF model with one context and a KV-cache sequence in it: its only one, or one
    of several that share the context (`split`)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        exact: bool = False,
        devices: Sequence[int] | None = None,
        tensor_split: Sequence[float] = (),
        verify_padding: int | None = None,
        device_choices: bool | None = None,
        eval_callback=None,
    ) -> None:
        """`exact`: decode small batches with batch-invariant kernels, so a token's logits do
        not depend on how many tokens share its decode (needs specdec's llama.cpp patch).
        `devices`: the ggml devices that may hold the model's layers (devices.py: this
        machine's, or RPC workers'), all of them unless `n_gpu_layers` says how many, shared
        as `tensor_split` says; None: every device ggml registered. `verify_padding`: exact
        verifications padded to a multiple of this many rows (None: the backend's own,
        library.verify_padding). `device_choices`: greedy choices (decode_choices) taken by
        the device that computes the logits (None: device_choices.CHOICES_ON_DEVICE for it).
        `eval_callback`: llama.cpp's scheduler callback, shown the tensors of every decode
        (tensors.TensorRecorder's; diagnostics only)."""
        if exact:
            _refuse_inexact_placement(n_gpu_layers)
        self.exact = exact
        self._on_this_cpu = devices is None  # not on RPC workers (their kernels may differ)
        on_gpu = n_gpu_layers != 0 and self._on_this_cpu
        self.verify_padding = verify_padding or library.verify_padding(on_gpu)
        self.path = Path(path)
        self._model = _load_model(self.path, n_gpu_layers, devices, tensor_split)
        self._refuse_unrollbackable_memory()
        if device_choices is None:
            logits_on_gpu = on_gpu and self._output_layer_offloaded(n_gpu_layers)
            device_choices = choices_on_device(logits_on_gpu)
        self._wants_device_choices = device_choices
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._characters: dict[int, str] | None = None
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        self._n_threads = n_threads or default_threads()
        self._n_batch_wanted = n_batch
        self.tokens_decoded = 0
        self.decode_calls = 0
        self._pieces: dict[int, bytes] = {}
        self._spellings: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._seq = 0
        self._owns_model = self._owns_context = True  # not a `split` view
        self._children: list[LlamaBackend] = []  # its views: closed before it
        self._rounds: Rounds | None = None  # set on the views of a split context
        self._pool = 0  # which of the rounds' contexts a view's parts go to (Rounds.add_pool)
        self._turn: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self._eval_callback = eval_callback
        self._open_context(n_ctx)

    def resize_context(self, n_ctx: int) -> None:
        """An empty context of `n_ctx` tokens in place of this one; the weights stay loaded."""
        if not self._owns_context or self._children:
            raise RuntimeError("a context shared with views cannot be resized")
        self._close_context()
        self._open_context(n_ctx)

    # -- loading ---------------------------------------------------------------------------

    def _refuse_unrollbackable_memory(self) -> None:
        if llama_cpp.llama_model_is_recurrent(self._model) or llama_cpp.llama_model_is_hybrid(
            self._model
        ):
            self.close()
            raise ModelFileError(
                f"{self.path.name} is a recurrent or hybrid model: its memory cannot roll back "
                "rejected draft tokens.",
                "Use a transformer model (llama, qwen2, mistral, gemma ...) as drafter and target.",
            )

    def _output_layer_offloaded(self, n_gpu_layers: int) -> bool:
        """Whether llama.cpp puts the output layer with the offloaded ones: it offloads the
        last `n_gpu_layers` of the model's layers and the output layer after them."""
        return n_gpu_layers < 0 or n_gpu_layers > llama_cpp.llama_model_n_layer(self._model)

    def _open_context(self, n_ctx: int, n_sequences: int = 1, unified: bool = False) -> None:
        params = llama_cpp.llama_context_default_params()
        if self._wants_device_choices:  # never for a split context (`split`)
            params.n_outputs_max_per_seq = 0  # a verification's every row (default: 1)
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = self._n_batch_wanted
        params.n_seq_max = n_sequences
        if n_sequences > 1:
            # A stream of cells per sequence, in position order as alone (see `split`),
            # unless the logits need not be exact (the slots' drafters).
            params.kv_unified = unified
        params.n_threads = params.n_threads_batch = self._n_threads
        params.no_perf = True
        if self._eval_callback is not None:
            params.cb_eval = self._eval_callback
        if self.exact and library._exactness.inexact_gpu_backends():
            # llama.cpp would hand a large batch's products to that GPU, away from the CPU's
            # invariant kernels (the CUDA patch keeps invariant batches where their weights are)
            params.op_offload = False
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            self.close()
            raise ModelFileError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {self.path.name}.",
                "Try a smaller --ctx-size, or fewer --gpu-layers if GPU memory is short.",
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._device_sampler = (
            DeviceSampler(self._ctx, self._seq) if self._wants_device_choices else None
        )
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx))  # each sequence's share
        self.n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self.cached: list[int] = []
        self.truncations = 0  # of `cached` (decoding.backend.CacheAgreement)
        self.decode_seconds = 0.0  # a split context's rounds count on the backend split
        self._aligned_prompt_end = 0  # cached prompt chunks up to here: cut at PROMPT_CHUNKs
        self._init_batch()

    def _init_batch(self) -> None:
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        n = self.n_batch
        self._batch_token = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._batch_pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._batch_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))[:] = 1
        for i in range(n):  # once per backend: every slot belongs to its sequence
            self._batch.seq_id[i][0] = self._seq

    def _close_context(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        device_sampler = getattr(self, "_device_sampler", None)
        if device_sampler is not None:
            device_sampler.free()
            self._device_sampler = None

    def close(self) -> None:
        for child in getattr(self, "_children", []):
            child.close()
        if getattr(self, "_owns_context", True):
            self._close_context()
        elif getattr(self, "_batch", None) is not None:  # a view: only its batch is its own
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_owns_model", True) and getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
        self._model = self._ctx = None

    def __del__(self) -> None:
        self.close()

    # -- the Backend protocol --------------------------------------------------------------

    @property
    def chooses_on_device(self) -> bool:
        return self._device_sampler is not None

    def decode(self, tokens: Sequence[int], n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        if self._device_sampler is not None:
            self._attach_sampler(None)
        return cast(np.ndarray, self._decode(tokens, n_logit_rows, prompt))

    def decode_choices(
        self,
        tokens: Sequence[int],
        n_rows: int,
        prompt: bool = False,
        with_confidence: bool = False,
    ) -> Choices:
        if self._device_sampler is None or not self._attach_sampler(with_confidence):
            return ArgmaxRows(self.decode(tokens, n_rows, prompt))
        return cast(DeviceChoices, self._decode(tokens, n_rows, prompt))

    def _attach_sampler(self, with_confidence: bool | None) -> bool:
        """The device's greedy sampler attached (with each choice's probability or not) or
        none (None); where llama.cpp cannot attach one, this backend's choices are the
        host's from now on."""
        assert self._device_sampler is not None
        if self._device_sampler.attach(with_confidence):
            return True
        self._device_sampler.free()
        self._device_sampler = None
        return False

    def _decode(
        self, tokens: Sequence[int], n_logit_rows: int, prompt: bool
    ) -> np.ndarray | DeviceChoices:
        """The last `n_logit_rows` rows' logits, or their greedy choices where the device's
        sampler is attached."""
        if not 1 <= n_logit_rows <= min(len(tokens), self.n_batch):
            raise ValueError(f"cannot return {n_logit_rows} logit rows for {len(tokens)} tokens")
        if len(self.cached) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(self.cached) + len(tokens)} tokens do not fit the context of {self.n_ctx}.",
                "Raise --ctx-size or shorten the prompt.",
            )
        tokens = list(tokens)
        # Generated tokens (a next token, or a draft to verify: every row's logits wanted)
        # must not depend on their batch in exact mode. A prompt (only its last row wanted)
        # keeps the fast kernels, cut at fixed positions, unless the invariant ones are as
        # cheap here (INVARIANT_PROMPT_ISAS).
        generated = not prompt and len(tokens) == n_logit_rows
        if self._rounds is not None and (
            generated if self._pool == 0 else self._steps(tokens, prompt)
        ):
            return self._rounds.submit(self._seq, tokens, self._pool, n_logit_rows)
        invariant = self.exact and (generated or self._invariant_prompt_kernels)
        if invariant and generated and (width := self._padded_width(len(tokens))) > len(tokens):
            return self._decode_padded(tokens, width)
        if prompt and self.exact and not invariant:
            return self._decode_prompt_aligned(tokens, n_logit_rows)
        size = min(self.n_batch, EXACT_BATCH_ROWS) if invariant else self.n_batch
        bounds = chunk_bounds(len(tokens), size, n_logit_rows)
        for start, stop in zip(bounds, bounds[1:], strict=False):
            if start > bounds[0]:
                raise_if_stopped()
            is_last = stop == len(tokens)
            rows = n_logit_rows if is_last else 0
            logits = self._decode_chunk(tokens[start:stop], rows, invariant)
        return logits

    def _padded_width(self, n_tokens: int) -> int:
        """The rows a decode of `n_tokens` generated tokens takes (exactness.padded_rows by
        `verify_padding`), within one invariant batch and the context's room."""
        width = padded_rows(n_tokens, self.verify_padding)
        room = self.n_ctx - len(self.cached)
        return max(n_tokens, min(width, EXACT_BATCH_ROWS, self.n_batch, room))

    def _decode_padded(self, tokens: list[int], width: int) -> np.ndarray | DeviceChoices:
        """`tokens` decoded as `width` rows: the rows after them repeat the last token and
        every row's logits are computed, so such decodes share one shape; then the padding's
        cells are dropped. Rows are invariant, so padding changes none of theirs."""
        padding = width - len(tokens)
        outputs = self._decode_chunk(tokens + [tokens[-1]] * padding, width, True)
        self.truncate(len(self.cached) - padding)
        if isinstance(outputs, DeviceChoices):
            return outputs.first(len(tokens))
        return outputs[: len(tokens)]

    @property
    def _invariant_prompt_kernels(self) -> bool:
        """Exact prompts decoded with the invariant kernels: every cached token is kept."""
        return self.exact and self._on_this_cpu and invariant_prompts()

    @property
    def prompt_with_drafts(self) -> bool:
        return self._invariant_prompt_kernels

    @staticmethod
    def _steps(tokens: Sequence[int], prompt: bool) -> bool:
        """A drafter's decode that joins the slots' drafter rounds (DRAFT_ROUND_ROWS)."""
        return not prompt and len(tokens) <= DRAFT_ROUND_ROWS

    def _decode_prompt_aligned(
        self, tokens: list[int], n_logit_rows: int
    ) -> np.ndarray | DeviceChoices:
        """Exact mode's prompts. A prompt's keys and logits depend on how it is cut into
        decodes, so an answer would depend on what an earlier request left cached. Here a
        prompt is always cut the same way, whatever is cached: into chunks that start at
        multiples of PROMPT_CHUNK from position 0. Only cached chunks decoded so are kept;
        the cached tail after the last of them (a partial chunk, generated tokens) is
        decoded again with the new tokens."""
        size = self._prompt_chunk()
        base = len(self.cached)
        start = self._aligned_start(base)
        if start < base:
            tokens = self.cached[start:base] + tokens
            self.truncate(start)
        bounds = aligned_bounds(start, start + len(tokens), size, n_logit_rows)
        for first, stop in zip(bounds, bounds[1:], strict=False):
            if first > bounds[0]:
                raise_if_stopped()
            is_last = stop == bounds[-1]
            rows = n_logit_rows if is_last else 0
            logits = self._decode_chunk(tokens[first - start : stop - start], rows, False)
        full_last = bounds[-1] - bounds[-2] == size
        self._aligned_prompt_end = bounds[-1] if full_last else bounds[-2]
        return logits

    def _decode_chunk(
        self, chunk: list[int], n_logit_rows: int, invariant: bool
    ) -> np.ndarray | DeviceChoices:
        """One llama_decode; the logits of its last `n_logit_rows` rows: a view into
        llama.cpp's buffer, or a copy where other sequences share the context (their next
        decode would overwrite it); or their greedy choices where the device made them."""
        n = len(chunk)
        base = len(self.cached)
        self._batch_token[:n] = chunk
        self._batch_pos[:n] = np.arange(base, base + n)
        self._batch_logits[:n] = 0
        if n_logit_rows:
            self._batch_logits[n - n_logit_rows : n] = 1
        self._batch.n_tokens = n
        with self._turn():  # the context's and the cores' turn, where they are shared
            # process-wide switches: set for each decode
            library._exactness.set_invariant_rows(EXACT_BATCH_ROWS if invariant else 0)
            began = time.perf_counter()
            status = _llama_decode(self._ctx, self._batch)
            if status != 0:
                # A failure can leave part of the batch in the KV cache: keep it in step with
                # `cached`.
                llama_cpp.llama_memory_seq_rm(self._memory, self._seq, base, -1)
                raise decode_failure(status, base, self.n_ctx)
            logits = self._outputs(n, n_logit_rows)  # waits for a GPU's decode to end
            self.decode_seconds += time.perf_counter() - began
        self.cached.extend(chunk)
        self.tokens_decoded += n
        self.decode_calls += 1
        return logits

    def _outputs(self, n_tokens: int, n_rows: int) -> np.ndarray | DeviceChoices:
        if self._device_sampler is not None and self._device_sampler.attached:
            return self._device_sampler.choices(n_tokens - n_rows, n_rows)
        return self._logits(n_rows)

    def _logits(self, n_rows: int) -> np.ndarray:
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        rows = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab)
        )
        return rows.copy() if self._rounds is not None else rows

    def _prompt_chunk(self) -> int:
        return min(library.PROMPT_CHUNK, self.n_batch)

    def _aligned_start(self, n_cached: int) -> int:
        """Where an exact prompt decode starts when `n_cached` tokens are cached: the end of
        the last whole prompt chunk among them."""
        size = self._prompt_chunk()
        return min(n_cached, self._aligned_prompt_end) // size * size

    def prompt_reuse(self, prompt: Sequence[int]) -> int:
        keep = kept_prefix(self.cached, prompt, 1)  # as logits_for_suffix keeps
        return self._aligned_start(keep) if self._aligned_prompts else keep

    @property
    def reusable_prompt(self) -> int:
        """How many cached tokens a later prompt sharing them may keep: in exact mode with
        aligned prompts the whole prompt chunks (computed as a fresh prefill computes them),
        else all."""
        return self._aligned_prompt_end if self._aligned_prompts else len(self.cached)

    @property
    def _aligned_prompts(self) -> bool:
        return self.exact and not self._invariant_prompt_kernels

    def reusable_prefix(self, shared: int) -> int:
        """Of `shared` leading prompt tokens in a restored state, how many a prompt keeps:
        in exact mode with aligned prompts whole prompt chunks only (_decode_prompt_aligned)."""
        size = self._prompt_chunk()
        return shared // size * size if self._aligned_prompts else shared

    def save_state(self, n_tokens: int) -> bytes:
        """llama.cpp's state of the first `n_tokens` cached tokens (the rest is dropped)."""
        self.truncate(n_tokens)
        size = llama_cpp.llama_state_seq_get_size(self._ctx, self._seq)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, self._seq)
        return bytes(buffer)[:written]

    def restore_state(self, state: bytes, tokens: Sequence[int]) -> bool:
        """Load a state `save_state` gave for `tokens` (same model and kernels: the caller's
        key). In exact mode they count as whole prompt chunks, so only a state saved at a
        chunk boundary may be restored. False (and an empty cache) if llama.cpp refuses."""
        self.truncate(0)
        data = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        restored = state and llama_cpp.llama_state_seq_set_data(
            self._ctx, data, len(state), self._seq
        )
        if not restored:
            llama_cpp.llama_memory_seq_rm(self._memory, self._seq, 0, -1)
            return False
        self.cached = [int(t) for t in tokens]
        self._aligned_prompt_end = len(self.cached)
        return True

    def truncate(self, n_keep: int) -> None:
        with self._turn():
            removed = llama_cpp.llama_memory_seq_rm(self._memory, self._seq, n_keep, -1)
        if not removed:
            raise RuntimeError(f"llama.cpp refused to drop cached tokens from position {n_keep}")
        del self.cached[n_keep:]
        self.truncations += 1
        self._aligned_prompt_end = min(self._aligned_prompt_end, n_keep)

    def graphs_reused(self) -> int:
        """How many of this context's decodes so far reused a graph llama.cpp had built and
        allocated before: each small shape keeps its own (patch 0005), where llama.cpp alone
        keeps only the last shape's."""
        return int(llama_cpp.llama_perf_context(self._ctx).n_reused)

    # -- description -----------------------------------------------------------------------

    def describe(self) -> dict:
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buffer, 256)
        return {
            "path": str(self.path),
            "description": buffer.value.decode("utf-8", errors="replace"),
            "parameters": int(llama_cpp.llama_model_n_params(self._model)),
            "bytes": int(llama_cpp.llama_model_size(self._model)),
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
        }
