"""The llama.cpp backend: the only module that imports llama_cpp.

Uses the low-level batch API: one `llama_decode` per call with logits requested only for
the rows the engine needs, read in place from llama.cpp's output buffer, and rollback
with `llama_memory_seq_rm`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import json
import os
import queue
import re
import sys
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import jinja2  # llama-cpp-python's chat formatter renders with it
import numpy as np

from ..decoding.backend import VocabInfo, kept_prefix
from ..decoding.constraint import Constraint, forced_draft_tokens, plain_spelling
from ..errors import (
    ChatTemplateError,
    ContextOverflowError,
    ModelFileError,
)
from ..structured import Structure, StructureError, StructureKind
from .exactness import Exactness
from .llama_batches import aligned_bounds, chunk_bounds, decode_failure, round_widths
from .rounds import Part, Rounds

try:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ModelFileError(
        f"llama-cpp-python is not installed or failed to load ({exc}).",
        "Run `make install` (it builds llama-cpp-python with flags safe for this CPU).",
    ) from exc

# llama.cpp has one log callback for the whole process, so whether it prints is module state.
_verbose = False


@llama_cpp.llama_log_callback
def _log_to_stderr_when_verbose(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if _verbose:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def set_verbose(verbose: bool) -> None:
    """llama.cpp logs a lot while loading; show it only when asked."""
    global _verbose
    _verbose = verbose
    llama_cpp.llama_log_set(_log_to_stderr_when_verbose, ctypes.c_void_p(0))


set_verbose(False)
llama_cpp.llama_backend_init()


# An exact backend decodes generated tokens with batch-invariant kernels, in batches of up
# to this many: more than any verification batch (draft limit + 1). See patches/llama.cpp/
# and "What identical means" in README.md.
EXACT_BATCH_ROWS = 64
# Exact mode cuts prompts into chunks of this many tokens at fixed positions (0, 128, ...), so
# a prompt is computed the same way whatever an earlier request left in the cache.
PROMPT_CHUNK = 128
# Where the build's row-wise kernels are of these instruction sets (and nothing offloads to a
# GPU), exact mode decodes prompts with the batch-invariant kernels too, in batches of up to
# EXACT_BATCH_ROWS: then a token's keys are the same however its prompt was cut, and a later
# prompt keeps every cached token it shares, not only whole PROMPT_CHUNKs (an agent's next
# turn, a chat's next message). 2-core Zen 5, AVX-512 VNNI: 384 prompt tokens in 1.65-1.99 s
# so, 2.15-2.20 s in llama.cpp's 128-token chunks. AVX2's row-wise kernels verify 8 tokens
# for about 3x one, dearer than llama.cpp's prompt kernels: prompts keep those there.
INVARIANT_PROMPT_ISAS = ("avx512_vnni",)
# serve --parallel: a slot's drafter decode of up to this many tokens (its steps, and its
# catch-up after a verified draft: at most the longest draft and the target's token) goes
# into the slots' shared drafter rounds; a longer one (a new request's prompt) takes a turn
# of its own, as prompts do.
DRAFT_ROUND_ROWS = 64


def native_function(name: str, argtypes: list, restype):
    """A llama.cpp or ggml function looked up through libllama (which loads ggml's libraries),
    or None in a build without it (llama.cpp built without GGML_RPC has no
    ggml_backend_rpc_*, a stock build no ggml_cpu_set_invariant_rows)."""
    function = getattr(llama_cpp.llama_cpp._lib, name, None)
    if function is not None:
        function.argtypes, function.restype = argtypes, restype
    return function


CPU_TYPE = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU
GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
_dev_count = native_function("ggml_backend_dev_count", [], ctypes.c_size_t)
_dev_get = native_function("ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p)
_dev_type = native_function("ggml_backend_dev_type", [ctypes.c_void_p], ctypes.c_int)


def devices_of_type(types: tuple[int, ...]) -> list[int]:
    """ggml's registered devices of these types. RPC workers are never registered, so they
    are not among them."""
    devices = (_dev_get(i) for i in range(_dev_count()))
    return [device for device in devices if _dev_type(device) in types]


# The invariant kernels' switches of every backend in this build (exactness.py). ggml makes each
# one process-wide: each decode sets them for its own model.
_exactness = Exactness(native_function)


def has_invariant_kernels() -> bool:
    """Whether every backend of this build that specdec patches has its invariant kernels."""
    return _exactness.on_cpu and not _exactness.missing_in_build()


def keep_invariant_kernels() -> None:
    """Batch-invariant kernels for every batch of up to EXACT_BATCH_ROWS rows, from now on in
    this process (an RPC worker, which cannot tell a prompt from a draft)."""
    if not has_invariant_kernels():
        raise ModelFileError(
            "this llama.cpp build has no batch-invariant kernels, so a worker would make exact "
            "clients' answers depend on batching.",
            "Run `make install` (it applies specdec's llama.cpp patch).",
        )
    _exactness.set_invariant_rows(EXACT_BATCH_ROWS)


def rowwise_kernels() -> str:
    """The instruction set of specdec's row-wise K-quant kernels in this build (patch 0002:
    exact mode verifies Q4_K/Q6_K weights at a fraction of n one-token decodes), "none" where
    the build has none for this CPU, or "absent" in a build without the patch."""
    isa = native_function("ggml_cpu_specdec_rowwise_isa", [], ctypes.c_char_p)
    return "absent" if isa is None else isa().decode()


class _DecodeThread:
    """One thread that runs every llama_decode handed to it. llama.cpp's CPU backend splits
    each decode over OpenMP threads, and every thread that calls it gets a team of its own:
    once a second team existed, every decode ran a third slower on the 2-core Zen 5 (64
    tokens at 40 tok/s from one thread, 27 once another thread had decoded, whichever thread
    decoded after). A server decodes from several threads (its slots, a probe at start), so
    it hands every decode to this one (`decode_on_one_thread`)."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="specdec-decode", daemon=True).start()

    def run(self, work: Callable[[], int]) -> int:
        done = threading.Event()
        outcome: list = []
        self._work.put((work, done, outcome))
        done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _serve(self) -> None:
        while True:
            work, done, outcome = self._work.get()
            try:
                outcome.append(work())
            except BaseException as error:  # the caller raises it
                outcome.append(error)
            done.set()


_decode_thread: _DecodeThread | None = None


def decode_on_one_thread() -> None:
    """From now on, every llama_decode in this process runs on one thread (_DecodeThread)."""
    global _decode_thread
    if _decode_thread is None:
        _decode_thread = _DecodeThread()


def _llama_decode(ctx, batch) -> int:
    if _decode_thread is None:
        return llama_cpp.llama_decode(ctx, batch)
    return _decode_thread.run(lambda: llama_cpp.llama_decode(ctx, batch))


def invariant_prompts() -> bool:
    """Whether exact mode decodes prompts with the batch-invariant kernels on this machine
    (INVARIANT_PROMPT_ISAS, and no GPU: llama.cpp offloads a large batch's products to one
    even with every layer on the CPU)."""
    global _invariant_prompts
    if _invariant_prompts is None:
        isa = rowwise_kernels() if _exactness.on_cpu else "absent"
        _invariant_prompts = isa in INVARIANT_PROMPT_ISAS and not devices_of_type(GPU_TYPES)
    return _invariant_prompts


_invariant_prompts: bool | None = None


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def library_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")


def kernel_signature(exact: bool) -> str:
    """What decides which kernels a decode runs and so what it costs, for keying measured
    decode costs: the library's version, the shared library's build (size and time: a rebuild
    with other kernels or flags is another build), whether it has the batch-invariant kernels
    and whether they are used (exact) and up to how many rows."""
    parts = [f"llama-cpp-python={library_version()}", f"lib={_library_build()}"]
    parts.append(f"gpu={'+'.join(_exactness.gpu_backends) or 'none'}")
    if not _exactness.on_cpu:
        parts.append("invariant=none")
    else:
        parts.append(f"invariant-backends={_exactness.signature()}")
        parts.append(f"invariant=rows<={EXACT_BATCH_ROWS}" if exact else "invariant=off")
        parts.append(f"rowwise={rowwise_kernels()}")
        if exact and invariant_prompts():  # a prompt's keys differ from chunked prompts'
            parts.append("prompts=invariant")
    return ",".join(parts)


def _library_build() -> str:
    """A short digest of the size and time of every llama.cpp and ggml library file beside
    libllama (the kernels live in libggml-cpu, which a rebuild may change alone)."""
    try:
        folder = Path(llama_cpp.llama_cpp._lib._name).resolve().parent
        files = sorted(p for p in folder.iterdir() if p.name.startswith(("libllama", "libggml")))
        stamps = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    except (AttributeError, OSError, TypeError):
        return "unknown"
    return hashlib.sha256("|".join(stamps).encode()).hexdigest()[:12]


# A round's lane: a sequence's view, its part (None: padding only) and its rows' count.
Lane = tuple["LlamaBackend", Part | None, int]


class LlamaBackend:
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
    ) -> None:
        """`exact`: decode small batches with batch-invariant kernels, so a token's logits do
        not depend on how many tokens share its decode (needs specdec's llama.cpp patch).
        `devices`: the ggml devices that may hold the model's layers (rpc_devices: this
        machine's, or RPC workers'), all of them unless `n_gpu_layers` says how many, shared
        as `tensor_split` says; None: every device ggml registered."""
        if exact:
            _refuse_inexact_placement(n_gpu_layers)
        self.exact = exact
        self._on_this_cpu = devices is None  # not on RPC workers (their kernels may differ)
        self.path = Path(path)
        self._model = _load_model(self.path, n_gpu_layers, devices, tensor_split)
        self._refuse_unrollbackable_memory()
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

    def _open_context(self, n_ctx: int, n_sequences: int = 1, unified: bool = False) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = self._n_batch_wanted
        params.n_seq_max = n_sequences
        if n_sequences > 1:
            # A stream of cells per sequence, in position order as alone (see `split`),
            # unless the logits need not be exact (the slots' drafters).
            params.kv_unified = unified
        params.n_threads = params.n_threads_batch = self._n_threads
        params.no_perf = True
        if self.exact and _exactness.inexact_gpu_backends():
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
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx))  # each sequence's share
        self.n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self.cached: list[int] = []
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

    # -- several sequences -------------------------------------------------------------------

    def split(
        self,
        n_sequences: int,
        pass_cost: Callable[[int], float] | None = None,
        rounds: Rounds | None = None,
    ) -> list[LlamaBackend]:
        """A backend for each of `n_sequences` KV sequences of one new context, each of this
        context's size (serve --parallel). Their generated rows are decoded together in
        rounds (rounds.py); a prompt is decoded alone, in its own llama_decode calls.

        Exact mode stays exact (docs/multi-sequence-exactness.md): a stream of cells per
        sequence (kv_unified off), kept in position order as alone; prompts alone; in a
        round each sequence's rows together, padded or left ragged (`_decode_round`), and
        batch-invariant kernels for all the round's rows. This backend keeps the model and
        the context, and is not decoded with any more. `pass_cost`: seconds for a decode of
        n rows of one sequence, by which a round's parts are padded or left ragged;
        without it, padded.

        With `rounds` (another split context's: the target's), this one's sequences are the
        slots' drafters: their steps join those rounds as a pool of their own, several
        requests' steps in one decode (`_decode_drafter_round`), in one cache for all
        (kv_unified: a drafter's logits need not be exact)."""
        per_sequence, solo_batch = self.n_ctx, self.n_batch
        self._close_context()
        rows = EXACT_BATCH_ROWS if rounds is None else DRAFT_ROUND_ROWS
        self._n_batch_wanted = max(solo_batch, n_sequences * rows)  # a full round
        self._open_context(per_sequence * n_sequences, n_sequences, unified=rounds is not None)
        self.n_ctx = per_sequence
        self._pass_cost = pass_cost
        if rounds is None:
            self._rounds_of_views, pool = Rounds(self._decode_round), 0
        else:
            self._rounds_of_views, pool = rounds, rounds.add_pool(self._decode_drafter_round)
        self._views = {seq: self._view(seq, solo_batch, pool) for seq in range(n_sequences)}
        return list(self._views.values())

    def _view(self, seq: int, n_batch: int, pool: int) -> LlamaBackend:
        view = copy.copy(self)
        view.n_batch = n_batch  # its own decodes are cut as alone
        view._owns_model = view._owns_context = False
        view._seq, view._rounds, view._pool = seq, self._rounds_of_views, pool
        view._turn = self._rounds_of_views.turn
        view.cached, view._aligned_prompt_end, view._children = [], 0, []
        view.tokens_decoded = view.decode_calls = 0
        view._init_batch()
        self._children.append(view)
        return view

    def alongside(self) -> tuple[int, int]:
        """The other requests this sequence's next rows will share a pass with: how many,
        and the most rows one of them decodes ((0, 0) for a backend of its own)."""
        return (0, 0) if self._rounds is None else self._rounds.alongside(self._seq)

    @property
    def rounds(self) -> Rounds | None:
        """The rounds a split context's views share (None for a backend of its own)."""
        return self._rounds

    def _decode_round(self, parts: list[Part]) -> int:
        """Every part's rows in one llama_decode, sequence after sequence. llama.cpp computes
        a batch of a non-unified cache in equal shares of consecutive sequences
        (llama_batches.equal_split_sizes): a sequence between two of the round's that has
        none of its own gets padding rows (sequences 0 and 2 alone cost two computes, 2.0x
        one row, on the Zen 5; with 1's padding, one), and the parts are padded to the
        widest (one compute) or left ragged (a compute for the wider parts' further rows),
        whichever the pass's costs say is cheaper (round_widths). Padding rows' logits
        are not asked for, and their cells are removed afterwards. How many there were."""
        by_seq = {part.seq: part for part in parts}
        first, last = min(by_seq), max(by_seq)
        rows = [len(by_seq[seq].tokens) if seq in by_seq else 0 for seq in range(first, last + 1)]
        widths = round_widths(rows, self._pass_cost, self.n_batch)
        lanes = self._round_lanes(by_seq, range(first, last + 1), widths)
        return self._decode_lanes(lanes, filler=parts[0].tokens[-1], invariant=self.exact)

    def _decode_drafter_round(self, parts: list[Part]) -> int:
        """The drafters' parts one after another in one llama_decode, llama.cpp's own
        kernels: a unified cache makes one compute of them whatever their widths, so none
        is padded."""
        lanes: list[Lane] = [(self._views[part.seq], part, len(part.tokens)) for part in parts]
        return self._decode_lanes(lanes, filler=0, invariant=False)

    def _decode_lanes(self, lanes: list[Lane], filler: int, invariant: bool) -> int:
        """One llama_decode of the lanes, one after another, each padded with `filler` rows
        to its width; each part gets the logits of its last `n_logits` rows (0: all), and
        its view the tokens; padding cells are removed again. How many padding rows there
        were."""
        starts = self._fill_round_batch(lanes, filler)
        n = self._batch.n_tokens
        # every row of the round, invariant or none
        _exactness.set_invariant_rows(max(EXACT_BATCH_ROWS, n) if invariant else 0)
        status = _llama_decode(self._ctx, self._batch)
        for (view, part, _), start in zip(lanes, starts, strict=True):
            real = 0 if part is None or status != 0 else len(part.tokens)
            llama_cpp.llama_memory_seq_rm(self._memory, view._seq, len(view.cached) + real, -1)
            if real:
                assert part is not None
                wanted = part.n_logits or real
                part.logits = self._output_rows(start + real - wanted, wanted)
                view.cached.extend(part.tokens)
                view.tokens_decoded += real
                view.decode_calls += 1
        if status != 0:
            position = min(len(view.cached) for view, _, _ in lanes)
            raise decode_failure(status, position, self.n_ctx)
        return n - sum(len(part.tokens) for _, part, _ in lanes if part is not None)

    def _fill_round_batch(self, lanes: list[Lane], filler: int) -> list[int]:
        """The batch holds the lanes one after another, each padded with `filler` rows
        (logits not asked for) to its width, a part's last `n_logits` rows (0: all) asked
        for; where each lane starts."""
        n = sum(width for _, _, width in lanes)
        if n > self.n_batch:
            raise ValueError(f"{n} rows of {len(lanes)} sequences exceed a batch of {self.n_batch}")
        starts, start = [], 0
        for view, part, width in lanes:
            rows = slice(start, start + width)
            tokens = list(part.tokens) if part is not None else []
            wanted = (part.n_logits or len(tokens)) if part is not None else 0
            base = len(view.cached)
            self._batch_token[rows] = [*tokens, *[filler] * (width - len(tokens))]
            self._batch_pos[rows] = np.arange(base, base + width)
            asked = [0] * (len(tokens) - wanted) + [1] * wanted
            self._batch_logits[rows] = asked + [0] * (width - len(tokens))
            for row in range(start, start + width):
                self._batch.seq_id[row][0] = view._seq
            starts.append(start)
            start += width
        self._batch.n_tokens = n
        return starts

    def _round_lanes(self, by_seq: dict[int, Part], seqs: range, widths: list[int]) -> list[Lane]:
        """The round's sequences in order, with their rows' count: each part's, and padding
        for the sequences between them that have room for it."""
        lanes: list[Lane] = []
        for seq, width in zip(seqs, widths, strict=True):
            view = self._views[seq]
            if seq in by_seq:
                lanes.append((view, by_seq[seq], width))
            elif len(view.cached) + width <= view.n_ctx:
                lanes.append((view, None, width))
        return lanes

    def _output_rows(self, batch_row: int, n_rows: int) -> np.ndarray:
        """A copy of the logits of `n_rows` rows from `batch_row` on, all asked for: they
        follow each other in llama.cpp's output buffer (padding rows have no output)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_row)
        return np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab)).copy()

    # -- the Backend protocol --------------------------------------------------------------

    def decode(self, tokens: Sequence[int], n_logit_rows: int, prompt: bool = False) -> np.ndarray:
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
        if prompt and self.exact and not invariant:
            return self._decode_prompt_aligned(tokens, n_logit_rows)
        size = min(self.n_batch, EXACT_BATCH_ROWS) if invariant else self.n_batch
        bounds = chunk_bounds(len(tokens), size, n_logit_rows)
        for start, stop in zip(bounds, bounds[1:], strict=False):
            is_last = stop == len(tokens)
            rows = n_logit_rows if is_last else 0
            logits = self._decode_chunk(tokens[start:stop], rows, invariant)
        return logits

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

    def _decode_prompt_aligned(self, tokens: list[int], n_logit_rows: int) -> np.ndarray:
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
            is_last = stop == bounds[-1]
            rows = n_logit_rows if is_last else 0
            logits = self._decode_chunk(tokens[first - start : stop - start], rows, False)
        full_last = bounds[-1] - bounds[-2] == size
        self._aligned_prompt_end = bounds[-1] if full_last else bounds[-2]
        return logits

    def _decode_chunk(self, chunk: list[int], n_logit_rows: int, invariant: bool) -> np.ndarray:
        """One llama_decode; the logits of its last `n_logit_rows` rows: a view into
        llama.cpp's buffer, or a copy where other sequences share the context (their next
        decode would overwrite it)."""
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
            _exactness.set_invariant_rows(EXACT_BATCH_ROWS if invariant else 0)
            status = _llama_decode(self._ctx, self._batch)
            if status != 0:
                # A failure can leave part of the batch in the KV cache: keep it in step with
                # `cached`.
                llama_cpp.llama_memory_seq_rm(self._memory, self._seq, base, -1)
                raise decode_failure(status, base, self.n_ctx)
            logits = self._logits(n_logit_rows)
        self.cached.extend(chunk)
        self.tokens_decoded += n
        self.decode_calls += 1
        return logits

    def _logits(self, n_rows: int) -> np.ndarray:
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        rows = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab)
        )
        return rows.copy() if self._rounds is not None else rows

    def _prompt_chunk(self) -> int:
        return min(PROMPT_CHUNK, self.n_batch)

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
        self._aligned_prompt_end = min(self._aligned_prompt_end, n_keep)

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if n < 0:
            capacity = -n
            buffer = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special, parse_special
            )
        return list(buffer[:n])

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, special=False)
        return piece

    def token_spelling(self, token: int) -> bytes:
        spelling = self._spellings.get(token)
        if spelling is None:
            spelling = self._spellings[token] = self._piece(token, special=True)
        return spelling

    def _piece(self, token: int, special: bool) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 256, 0, special)
        return buffer.raw[: max(n, 0)]

    def is_end_of_generation(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            vocab_type=int(llama_cpp.llama_vocab_type(v)),
            n_vocab=self.n_vocab,
            bos=int(llama_cpp.llama_vocab_bos(v)),
            eos=int(llama_cpp.llama_vocab_eos(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    # -- prompts ---------------------------------------------------------------------------

    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Render messages (and tools, where given) through the GGUF's own chat template,
        as llama-cpp-python does."""
        template = self.chat_template()
        if template is None:
            raise ModelFileError(
                f"{self.path.name} has no chat template in its metadata.",
                "Pass --raw to send the prompt as plain text.",
            )
        info = self.vocab_info()
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(info.eos) if info.eos >= 0 else "",
            bos_token=self.token_text(info.bos) if info.bos >= 0 else "",
        )
        try:
            # Typed as OpenAI-style message TypedDicts; plain role/content dicts are what it reads.
            return formatter(messages=messages, tools=tools).prompt  # type: ignore[arg-type]
        except jinja2.TemplateError as error:  # e.g. "roles must alternate"
            raise ChatTemplateError(
                f"The model's chat template refused these messages: {error}",
                "Check the roles and their order (many templates want user and assistant "
                "turns to alternate).",
            ) from None

    # -- structured outputs ----------------------------------------------------------------

    def character_tokens(self) -> dict[int, str]:
        """The printable ASCII characters and newline that are a token of their own."""
        if self._characters is None:
            self._characters = {}
            for character in [chr(c) for c in range(32, 127)] + ["\n"]:
                ids = self.tokenize(character, add_special=False)
                if len(ids) == 1:
                    self._characters[ids[0]] = character
        return self._characters

    def plain_spelling(self, text: str) -> list[int]:
        """A grammar's text in this vocabulary's tokens, its tags as plain text."""
        return plain_spelling(text, self._tokenize_special, self._added_text)

    def _tokenize_special(self, text: str) -> list[int]:
        return self.tokenize(text, add_special=False, parse_special=True)

    def _added_text(self, token: int) -> str | None:
        added = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        attributes = llama_cpp.llama_vocab_get_attr(self._vocab, token)
        return self.token_text(token) if attributes & added else None

    def end_tokens(self) -> list[int]:
        """The tokens a chat answer ends with, the turn's end first."""
        ends = (llama_cpp.llama_vocab_eot(self._vocab), llama_cpp.llama_vocab_eos(self._vocab))
        return list(dict.fromkeys(int(t) for t in ends if t >= 0))

    def constrain(self, structure: Structure) -> Constraint:
        """llama.cpp's grammar engine over this vocabulary, at the grammar's start."""
        grammar = grammar_text(structure).encode("utf-8")
        sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar, b"root")
        if not sampler:
            raise StructureError(
                "llama.cpp could not parse the grammar.",
                "Check it against llama.cpp's GBNF (grammars/README.md); --verbose shows where.",
            )
        return GrammarConstraint(sampler, owner=self)

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


def _refuse_inexact_placement(n_gpu_layers: int) -> None:
    """Exact mode needs batch-invariant kernels wherever the model's layers run: refuse a build
    without specdec's patches, and layers on a GPU backend that has none (it refuses rather
    than verify on the CPU: with the weights on the GPU that would be slower than the target
    alone there, which breaks the other half of the promise)."""
    if not has_invariant_kernels():
        missing = ", ".join(_exactness.missing_in_build())
        raise ModelFileError(
            f"this llama.cpp build has no batch-invariant kernels ({missing}), so exact mode "
            "cannot guarantee the target's own answer.",
            "Run `make install` (it applies specdec's llama.cpp patches), or pass --fast.",
        )
    inexact = _exactness.inexact_gpu_backends()
    if inexact and n_gpu_layers != 0:
        raise ModelFileError(
            f"exact mode has no batch-invariant kernels for {', '.join(inexact)} yet, so answers "
            "with layers there could differ from the target alone's.",
            "Pass --fast for llama.cpp's own kernels there, or --gpu-layers 0 for exact answers "
            "on the CPU.",
        )


def _load_model(
    path: Path, n_gpu_layers: int, devices: Sequence[int] | None, tensor_split: Sequence[float]
):
    if not path.is_file():
        raise ModelFileError(
            f"model file not found: {path}", "Check the path, or use a name from `specdec models`."
        )
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ModelFileError(
                f"{path} is not a GGUF file.", "Pass a .gguf model (llama.cpp's format)."
            )
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    # kept referenced until the load returns: llama.cpp reads them during it
    device_list = (
        (ctypes.c_void_p * (len(devices) + 1))(*devices, None) if devices is not None else None
    )
    if device_list is not None:
        params.devices = ctypes.cast(device_list, ctypes.c_void_p)
    shares = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*tensor_split) if tensor_split else None
    if shares is not None:
        params.tensor_split = shares
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelFileError(
            f"llama.cpp could not load {path}.",
            "The file may be truncated or of an architecture this llama.cpp build does not know; "
            "run with --verbose to see llama.cpp's log.",
        )
    return model


QUANT_TYPES = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}


def requantize(source: Path, destination: Path, quant: str = "q4_0", threads: int | None = None):
    """Write `source` re-quantised to `quant` (llama.cpp's llama_model_quantize).

    Requantising an already-quantised file loses a little accuracy; for a drafter that only
    costs acceptance, which the caller measures. Writes a temporary file and renames it, so
    an interrupted run leaves nothing that looks complete."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant]
    params.nthread = threads or default_threads()
    params.allow_requantize = True
    partial = destination.with_name(destination.name + ".partial")
    status = llama_cpp.llama_model_quantize(
        str(source).encode("utf-8"), str(partial).encode("utf-8"), ctypes.byref(params)
    )
    if status != 0:
        partial.unlink(missing_ok=True)
        raise ModelFileError(
            f"llama.cpp could not requantise {source.name} (status {status}).",
            "Check that the file is a complete GGUF model and the disk has room.",
        )
    os.replace(partial, destination)
    return destination


def grammar_text(structure: Structure) -> str:
    """The GBNF for a structure: its own, llama.cpp's JSON grammar, or the schema converted
    by llama-cpp-python's converter (structured.py refuses what it would ignore)."""
    if structure.kind == StructureKind.GRAMMAR:
        return structure.text
    if structure.kind == StructureKind.JSON_OBJECT:
        return JSON_GBNF
    try:
        grammar = json_schema_to_gbnf(structure.text)
    except (AssertionError, KeyError, ValueError, TypeError, NotImplementedError) as error:
        raise StructureError(f"the JSON schema cannot be turned into a grammar: {error}") from None
    if not (structure.before or structure.after):
        return grammar
    inner = re.sub(r"^root ::=", "schema-root ::=", grammar, count=1, flags=re.MULTILINE)
    parts = [_gbnf_literal(structure.before)] if structure.before else []
    parts.append("schema-root")
    if structure.after:
        parts.append(_gbnf_literal(structure.after))
    return f"root ::= {' '.join(parts)}\n{inner}"


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals escape as JSON's do (\n, \", \\)


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


class GrammarConstraint:
    """A llama.cpp grammar sampler asked token by token (decoding/constraint.py): it sets
    the logit of each token the grammar forbids to -inf."""

    def __init__(self, sampler, owner: LlamaBackend) -> None:
        self._sampler = sampler
        self._owner = owner  # the grammar reads the model's vocabulary: keep it alive

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        candidates = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(llama_cpp.llama_token_data_p), len(ids), -1, False
        )
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(candidates))
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        # llama.cpp aborts the process on a token its grammar forbids: ask first (25 us).
        if not self.allowed(np.array([token], dtype=np.int32))[0]:
            raise StructureError(f"token {token} is not allowed by the grammar here.")
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def copy(self) -> GrammarConstraint:
        return GrammarConstraint(llama_cpp.llama_sampler_clone(self._sampler), self._owner)

    def forced_tokens(self, written: str = "", seen: Collection[int] = ()) -> list[int]:
        owner = self._owner
        characters, ends = owner.character_tokens(), owner.end_tokens()
        return forced_draft_tokens(self, characters, owner.plain_spelling, written, ends, seen)

    def __del__(self) -> None:
        if getattr(self, "_sampler", None):
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None
