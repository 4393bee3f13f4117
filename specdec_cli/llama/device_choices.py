"""Greedy choices taken where a model's logits are computed: llama.cpp's backend sampling.

A greedy verdict reads only each row's argmax. Sending every row of logits to the host
(600 kB a row for Qwen's 152k-token vocabulary) and taking its argmax there (about 35 µs a
row on a Xeon) is host time in every verification: a few percent of a GPU's step. With
llama.cpp's greedy sampler attached to a context's sequence, the decode's graph takes each
output row's argmax on the device that computed it, and only the token comes back. llama.cpp
then copies no raw logits for that sequence, so a backend attaches it only while its caller
wants choices alone (LlamaBackend.decode_choices) and detaches it when logits are wanted;
either change makes llama.cpp reserve its graphs again at the next decode. A drafter's step
also wants its choice's probability (how sure it is, which plans how long drafts are): a
sampler of specdec's own adds it, one float a row, where the host would take a softmax over
the whole row (126 µs for 152k logits on a Xeon: 11% of a 0.5B step on an H200).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BadUsageError
from . import library
from .library import llama_cpp, native_function

# By the backend that computes a model's output layer: whether greedy choices are taken there.
# CPU: no. In the graph, llama.cpp copies the logits once more (a padding row) and ggml's argmax
# of a row runs on one thread: scripts/choice_costs.py, exact mode, 2-core Zen 4 (AVX-512),
# 2026-12-07, device against host: Qwen2.5-Coder 0.5B 1 row 18.66 against 18.23 ms, 8 rows
# 54.37 against 52.13, a drafter's step (with its probability) 18.96 against 18.52; 1.5B 1 row
# 32.03 against 31.81, 8 rows 92.22 against 90.73.
# CUDA: not until measured on a GPU (scripts/choice_costs.py, run by scripts/gpu_device.sh).
# SPECDEC_DEVICE_CHOICES=1 or 0 sets it for every backend, to measure.
CHOICES_ON_DEVICE = {"CPU": False, "CUDA": False}


def choices_on_device(logits_on_gpu: bool) -> bool:
    """Whether a model whose output layer runs on a GPU (or not) takes its greedy choices
    there (CHOICES_ON_DEVICE, SPECDEC_DEVICE_CHOICES)."""
    switch = os.environ.get("SPECDEC_DEVICE_CHOICES", "").strip()
    if switch not in ("", "0", "1"):
        raise BadUsageError(
            f"SPECDEC_DEVICE_CHOICES must be 1 (greedy choices taken by the device that "
            f"computes the logits) or 0 (on the host), not '{switch}'.",
            "Unset it, or set it to 1 or 0 to measure the two.",
        )
    if switch:
        return switch == "1"
    return CHOICES_ON_DEVICE.get(library._exactness.layers_backend(logits_on_gpu), False)


@dataclass(frozen=True)
class DeviceChoices:
    """A decode's greedy choices as the device sent them back (decoding.backend.Choices)."""

    tokens: list[int]
    confidences: list[float] | None  # where they were asked for

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, row: int) -> int:
        return self.tokens[row]

    def confidence(self, row: int) -> float:
        if self.confidences is None:
            raise ValueError("these choices were decoded without their probabilities")
        return self.confidences[row]

    def first(self, n_rows: int) -> DeviceChoices:
        """The first `n_rows` rows' (a padded decode's real rows)."""
        confidences = None if self.confidences is None else self.confidences[:n_rows]
        return DeviceChoices(self.tokens[:n_rows], confidences)


class DeviceSampler:
    """The sampler attached to one sequence of one context: none, llama.cpp's greedy one, or
    specdec's greedy one with each choice's probability. llama.cpp initialises a sampler
    chain for its context once: each attach makes a new one."""

    def __init__(self, ctx, seq: int) -> None:
        self._ctx, self._seq = ctx, seq
        self._chain = None
        self.with_confidence: bool | None = None  # None: none attached

    @property
    def attached(self) -> bool:
        return self._chain is not None

    def attach(self, with_confidence: bool | None) -> bool:
        """A greedy sampler, with each choice's probability or not, from the next decode on
        (None: none). False where llama.cpp cannot offload it to the device of the logits:
        then none is attached."""
        if with_confidence == self.with_confidence:
            return True
        if self._chain is not None:
            llama_cpp.llama_set_sampler(self._ctx, self._seq, None)
            self.free()
        if with_confidence is None:
            return True
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        greedy = _confident_greedy() if with_confidence else llama_cpp.llama_sampler_init_greedy()
        llama_cpp.llama_sampler_chain_add(chain, greedy)
        if not llama_cpp.llama_set_sampler(self._ctx, self._seq, chain):
            llama_cpp.llama_sampler_free(chain)
            return False
        self._chain, self.with_confidence = chain, with_confidence
        return True

    def choices(self, first_row: int, n_rows: int) -> DeviceChoices:
        """The choices of the last decode's batch rows `first_row` .. + `n_rows` (each asked
        for output)."""
        rows = range(first_row, first_row + n_rows)
        tokens = [int(llama_cpp.llama_get_sampled_token_ith(self._ctx, row)) for row in rows]
        if any(token < 0 for token in tokens):  # LLAMA_TOKEN_NULL: no choice was made
            raise RuntimeError(f"llama.cpp made no greedy choice for rows {tokens}")
        if not self.with_confidence:
            return DeviceChoices(tokens, None)
        return DeviceChoices(tokens, [self._probability(row) for row in rows])

    def _probability(self, row: int) -> float:
        probabilities = llama_cpp.llama_get_sampled_probs_ith(self._ctx, row)
        if not probabilities:
            raise RuntimeError(f"llama.cpp sent back no probability for row {row}")
        return float(probabilities[0])

    def free(self) -> None:
        """The chain, once detached or its context freed (which keeps a pointer to it)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
            self.with_confidence = None


# -- specdec's sampler: each row's argmax and its raw softmax probability, in the graph --------


@functools.cache
def _ggml(name: str, *argtypes, restype=ctypes.c_void_p) -> Callable[..., int]:
    """A ggml function of the decode's graph (a tensor is a pointer), looked up once."""
    function = native_function(name, list(argtypes), restype)
    if function is None:
        raise RuntimeError(f"this llama.cpp build has no {name}")
    return function


@llama_cpp.llama_sampler_i_name
def _name(sampler) -> bytes:
    return b"specdec-greedy-with-confidence"


@llama_cpp.llama_sampler_i_apply
def _apply_on_host(sampler, candidates) -> None:
    # only ever attached where its backend_init said the device runs it
    raise RuntimeError("specdec's greedy sampler runs in the decode's graph only")


@llama_cpp.llama_sampler_i_backend_init
def _backend_init(sampler, buffer_type, n_outputs_max_per_seq) -> bool:
    return True  # argmax, softmax, get_rows: every ggml backend has them


@llama_cpp.llama_sampler_i_backend_apply
def _backend_apply(sampler, ctx, graph, data) -> None:
    """The row's argmax, and the softmax of its logits read at that index."""
    out, tensor, size = data.contents, ctypes.c_void_p, ctypes.c_int64
    n_vocab = _ggml("ggml_nelements", tensor, restype=size)(out.logits)
    choice = _ggml("ggml_argmax", tensor, tensor)(ctx, out.logits)
    softmax = _ggml("ggml_soft_max", tensor, tensor)(ctx, out.logits)
    column = _ggml("ggml_reshape_2d", tensor, tensor, size, size)(ctx, softmax, 1, n_vocab)
    out.sampled = choice
    out.probs = _ggml("ggml_get_rows", tensor, tensor, tensor)(ctx, column, choice)


_INTERFACE = llama_cpp.llama_sampler_i(
    name=_name,
    apply=_apply_on_host,
    backend_init=_backend_init,
    backend_apply=_backend_apply,
)


def _confident_greedy():
    """A new sampler of this kind (a chain that holds it frees it)."""
    return llama_cpp.llama_sampler_init(ctypes.byref(_INTERFACE), None)
