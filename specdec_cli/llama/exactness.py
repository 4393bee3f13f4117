"""Exact mode's kernels, backend by backend.

A token's logits are the same whatever its batch only where specdec's llama.cpp patches give a
backend batch-invariant kernels: ggml's CPU backend (patch 0001) and its CUDA backend (patch 0003).
Each exports one switch, `set_invariant_rows(n)`: while n > 0, a batch of at most n rows is
computed row by row as a lone row is. This module finds the switches in the loaded build, sets
them all for each decode, and names the GPU backends that have none (Metal, Vulkan, ROCm, SYCL...),
where exact mode must refuse rather than answer differently. A backend's patch plugs in by adding
its registry name and switch to INVARIANT_SWITCHES.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# ggml's registry name of a backend -> the switch its specdec patch exports. ROCm builds the CUDA
# sources under another name: it stays out until its kernels are shown invariant on its GPUs.
INVARIANT_SWITCHES = {
    "CPU": "ggml_cpu_set_invariant_rows",
    "CUDA": "ggml_backend_cuda_set_invariant_rows",
}
# A verification of n rows on a backend is decoded as the next multiple of this many rows (rows
# repeating its last token, whose logits are dropped and whose cache cells are freed at once),
# so that the backend sees few batch shapes: llama.cpp reuses its graph only for the shape it
# built last, and CUDA captures a graph per shape. Invariant kernels make padding change no
# row's logits. A single token is never padded (padded_rows): the target alone decodes only
# those, one shape already, and after a verification its graph rebuild (0.5 ms on the 7B
# shape) costs less than 8 rows would, even at 1.2x a step. 1: decoded as it is. On the CPU
# rows cost compute, not graphs. On CUDA, for now 1 as well: there a shape change costs 0.5 ms
# on a 7B step of 3.8 ms (H200, alternating n=1 and n=8: 1.13x its steady cost), while padding
# 3 rows to 8 would cost about 3 ms with today's invariant kernels (0.63 ms a column beyond
# the first); it pays once verify(8) nears one step.
# SPECDEC_VERIFY_PADDING=N sets it for every backend, to measure (scripts/gpu_device.sh).
VERIFY_PADDING = {"CPU": 1, "CUDA": 1}


def padded_rows(n_rows: int, padding: int) -> int:
    """The rows a decode of `n_rows` generated tokens takes where verifications are padded to
    multiples of `padding`: the next multiple, or one for a single token."""
    return n_rows if n_rows == 1 else -(-n_rows // padding) * padding


# ggml's registry names of GPU backends. A build with one compiled in registers it even where it
# finds no device (no driver, no GPU visible): such a build cannot do what it was built for.
GPU_REGISTRIES = ("CUDA", "ROCm", "MUSA", "Metal", "Vulkan", "SYCL", "OpenCL", "CANN")
CPU_TYPE = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU
GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU

Lookup = Callable[[str, list, object], Callable | None]


class Exactness:
    """The batch-invariant kernels of one loaded llama.cpp build: `lookup(name, argtypes,
    restype)` finds one of its functions (None where the build lacks it)."""

    def __init__(self, lookup: Lookup) -> None:
        self._switches = {
            backend: switch
            for backend, name in INVARIANT_SWITCHES.items()
            if (switch := lookup(name, [ctypes.c_int], None)) is not None
        }
        gpus = (name for _, kind, name in registered_devices(lookup) if kind in GPU_TYPES)
        self._gpu_backends = list(dict.fromkeys(gpus))  # each backend once, in ggml's order
        self._gpu_backends_without_device = [
            name for name, devices in registries(lookup) if name in GPU_REGISTRIES and not devices
        ]

    @property
    def on_cpu(self) -> bool:
        """Whether the CPU backend has the invariant kernels (a build with specdec's patches)."""
        return "CPU" in self._switches

    @property
    def gpu_backends(self) -> list[str]:
        """The registry names of this build's GPU backends that found a device (e.g. CUDA)."""
        return list(self._gpu_backends)

    @property
    def gpu_backends_without_device(self) -> list[str]:
        """GPU backends compiled into this build that found no device on this machine."""
        return list(self._gpu_backends_without_device)

    def inexact_gpu_backends(self) -> list[str]:
        """GPU backends without invariant kernels: exact mode cannot run layers there."""
        return [name for name in self._gpu_backends if name not in self._switches]

    def missing_in_build(self) -> list[str]:
        """Backends this build has whose patch is known but whose switch is absent (a build of
        stock llama.cpp, or one made without specdec's patches)."""
        backends = ["CPU", *self._gpu_backends]
        return [
            name for name in backends if name in INVARIANT_SWITCHES and name not in self._switches
        ]

    def layers_backend(self, on_gpu: bool) -> str:
        """The backend that decodes a model's layers: the first GPU backend where it has any
        on this machine's GPUs, else the CPU."""
        return self._gpu_backends[0] if on_gpu and self._gpu_backends else "CPU"

    def set_invariant_rows(self, n_rows: int) -> None:
        """Every backend's switch: batches of up to `n_rows` rows invariant (0: off)."""
        for switch in self._switches.values():
            switch(n_rows)

    def signature(self) -> str:
        """Which backends' invariant kernels this build has, for keying measured costs."""
        return "+".join(sorted(self._switches)) or "none"


def registered_devices(lookup: Lookup) -> list[tuple[int, int, str]]:
    """ggml's registered devices, each as (handle, device type, its backend's registry name);
    none in a build without ggml's device API. RPC workers are never registered, so they are
    not among them."""
    pointer = ctypes.c_void_p
    count = lookup("ggml_backend_dev_count", [], ctypes.c_size_t)
    get = lookup("ggml_backend_dev_get", [ctypes.c_size_t], pointer)
    kind = lookup("ggml_backend_dev_type", [pointer], ctypes.c_int)
    registry = lookup("ggml_backend_dev_backend_reg", [pointer], pointer)
    name = lookup("ggml_backend_reg_name", [pointer], ctypes.c_char_p)
    if count is None or get is None or kind is None or registry is None or name is None:
        return []
    devices = [get(index) for index in range(count())]
    return [(device, kind(device), name(registry(device)).decode()) for device in devices]


def registries(lookup: Lookup) -> list[tuple[str, int]]:
    """ggml's backend registries, each as (name, how many devices it found); none in a build
    without ggml's device API."""
    count = lookup("ggml_backend_reg_count", [], ctypes.c_size_t)
    get = lookup("ggml_backend_reg_get", [ctypes.c_size_t], ctypes.c_void_p)
    name = lookup("ggml_backend_reg_name", [ctypes.c_void_p], ctypes.c_char_p)
    devices = lookup("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t)
    if count is None or get is None or name is None or devices is None:
        return []
    handles = [get(index) for index in range(count())]
    return [(name(handle).decode(), devices(handle)) for handle in handles]
