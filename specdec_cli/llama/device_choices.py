"""Greedy choices taken where a model's logits are computed: llama.cpp's backend sampling.

A greedy verdict reads only each row's argmax. Sending every row of logits to the host
(600 kB a row for Qwen's 152k-token vocabulary) and taking its argmax there (about 35 µs a
row on a Xeon) is host time in every verification: a few percent of a GPU's step. With
llama.cpp's greedy sampler attached to a context's sequence, the decode's graph takes each
output row's argmax on the device that computed it, and only the token comes back. llama.cpp
then copies no raw logits for that sequence, so a backend attaches it only while its caller
wants choices alone (LlamaBackend.decode_choices) and detaches it when logits are wanted;
either change makes llama.cpp reserve its graphs again at the next decode.
"""

from __future__ import annotations

import os

from ..errors import BadUsageError
from . import library
from .library import llama_cpp

# By the backend that computes a model's output layer: whether greedy choices are taken there.
# CPU: no. In the graph, llama.cpp copies the logits once more (a padding row) and ggml's argmax
# of a row runs on one thread: scripts/choice_costs.py, exact mode, 2-core Zen 4 (AVX-512),
# 2026-12-07, device against host: Qwen2.5-Coder 0.5B 1 row 18.66 against 18.23 ms, 8 rows
# 54.37 against 52.13; 1.5B 1 row 32.03 against 31.81, 8 rows 92.22 against 90.73.
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


class DeviceArgmax:
    """llama.cpp's greedy sampler for one sequence of one context, attached or not. llama.cpp
    initialises a sampler chain for its context once: each attach makes a new one."""

    def __init__(self, ctx, seq: int) -> None:
        self._ctx, self._seq = ctx, seq
        self._chain = None  # while attached

    @property
    def attached(self) -> bool:
        return self._chain is not None

    def attach(self, on: bool) -> bool:
        """Choices taken on the device from the next decode on (or not). False where
        llama.cpp cannot offload the sampler to the device of the logits: then it stays off."""
        if on and self._chain is None:
            chain = llama_cpp.llama_sampler_chain_init(
                llama_cpp.llama_sampler_chain_default_params()
            )
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
            if not llama_cpp.llama_set_sampler(self._ctx, self._seq, chain):
                llama_cpp.llama_sampler_free(chain)
                return False
            self._chain = chain
        elif not on and self._chain is not None:
            llama_cpp.llama_set_sampler(self._ctx, self._seq, None)
            self.free()
        return True

    def tokens(self, first_row: int, n_rows: int) -> list[int]:
        """The choices of the last decode's batch rows `first_row` .. + `n_rows` (each asked
        for output)."""
        chosen = [
            int(llama_cpp.llama_get_sampled_token_ith(self._ctx, first_row + i))
            for i in range(n_rows)
        ]
        if any(token < 0 for token in chosen):  # LLAMA_TOKEN_NULL: no choice was made
            raise RuntimeError(f"llama.cpp made no greedy choice for rows {chosen}")
        return chosen

    def free(self) -> None:
        """The chain, once detached or its context freed (which keeps a pointer to it)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
