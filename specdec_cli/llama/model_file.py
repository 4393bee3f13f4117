"""Loading a GGUF file into llama.cpp (exact mode's placement checked first) and writing a
requantised copy of one."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelFileError
from . import library
from .library import (
    default_threads,
    llama_cpp,
)


def _refuse_inexact_placement(n_gpu_layers: int) -> None:
    """Exact mode needs batch-invariant kernels wherever the model's layers run: refuse a build
    without specdec's patches, and layers on a GPU backend that has none (it refuses rather
    than verify on the CPU: with the weights on the GPU that would be slower than the target
    alone there, which breaks the other half of the promise)."""
    if not library.has_invariant_kernels():
        missing = ", ".join(library._exactness.missing_in_build())
        raise ModelFileError(
            f"this llama.cpp build has no batch-invariant kernels ({missing}), so exact mode "
            "cannot guarantee the target's own answer.",
            "Run `make install` (it applies specdec's llama.cpp patches), or pass --fast.",
        )
    inexact = library._exactness.inexact_gpu_backends()
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
