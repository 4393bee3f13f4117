"""A decode's intermediate tensors as llama.cpp computes them (its scheduler's eval callback),
on any backend: for finding which operation first makes a token's values depend on its batch
(scripts/batch_op_diff.py). Only the tensors asked for are read; the scheduler computes the
nodes between two of them together, so fusions inside that stretch stay as in a plain decode.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .library import llama_cpp, native_function

GGML_TYPE_F32 = 0


class _Tensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor, as far as its name (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS
    64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


_tensor_get = native_function(
    "ggml_backend_tensor_get",
    [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
    None,
)
_op_desc = native_function("ggml_op_desc", [ctypes.c_void_p], ctypes.c_char_p)
_nbytes = native_function("ggml_nbytes", [ctypes.c_void_p], ctypes.c_size_t)


@dataclass(frozen=True)
class Recorded:
    """One F32 tensor of a decode: its first column (the batch's first token, for the
    tensors whose first dimension is a token's values) and where it came from."""

    name: str
    op: str
    shape: tuple[int, ...]
    first_column: np.ndarray


class TensorRecorder:
    """Records the first column of every F32 tensor whose name `wanted` accepts, decode by
    decode; pass `callback` to LlamaBackend(eval_callback=...)."""

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        if _tensor_get is None or _op_desc is None or _nbytes is None:
            raise RuntimeError("this llama.cpp build does not export ggml_backend_tensor_get")
        self.wanted = wanted
        self.recorded: list[Recorded] = []
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._observe)

    def _observe(self, pointer: int, ask: bool, user_data: int) -> bool:
        tensor = ctypes.cast(pointer, ctypes.POINTER(_Tensor)).contents
        if ask:  # only these are shown again, computed
            return _readable(pointer, tensor) and self.wanted(tensor.name.decode(errors="replace"))
        values = np.empty(int(tensor.ne[0]), dtype=np.float32)
        _tensor_get(pointer, values.ctypes.data, 0, values.nbytes)
        op = _op_desc(pointer).decode()
        name = tensor.name.decode(errors="replace")
        self.recorded.append(Recorded(name, op, tuple(tensor.ne), values))
        return True  # go on computing


def _readable(pointer: int, tensor: _Tensor) -> bool:
    """F32 with a first column of consecutive values (not an empty view: exact mode's batches
    have some, of no rows)."""
    return (
        tensor.type == GGML_TYPE_F32
        and tensor.nb[0] == 4
        and min(tensor.ne) > 0
        and 4 * tensor.ne[0] <= _nbytes(pointer)
    )
