"""ggml's devices and llama.cpp's RPC backend: the target's layers on workers (`specdec
worker`), and the worker itself. Called through ctypes, in the library llama/library.py loaded
(the one module that imports llama_cpp looks each function up)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelFileError
from . import rpc
from .exactness import CPU_TYPE, GPU_TYPES
from .library import (
    default_threads,
    devices_of_type,
    keep_invariant_kernels,
    native_function,
)

_dev_description = native_function(
    "ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p
)
_rpc_add_server = native_function("ggml_backend_rpc_add_server", [ctypes.c_char_p], ctypes.c_void_p)
_reg_dev_count = native_function("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t)
_reg_dev_get = native_function(
    "ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p
)
_rpc_start_server = native_function(
    "ggml_backend_rpc_start_server",
    [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p],
    None,
)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_set_abort_callback = native_function("ggml_set_abort_callback", [_ABORT_CALLBACK], ctypes.c_void_p)


def has_rpc() -> bool:
    return _rpc_add_server is not None and _rpc_start_server is not None


def _refuse_without_rpc() -> None:
    if not has_rpc():
        raise ModelFileError(
            "this llama.cpp build has no RPC backend.",
            "Run `make install` (it builds llama.cpp with GGML_RPC=ON).",
        )


def local_devices() -> list[int]:
    """This machine's GPUs (none on a CPU-only build: the CPU is always used besides them)."""
    return devices_of_type(GPU_TYPES)


def _served_devices() -> list[int]:
    """What a worker serves: this machine's GPUs, else its CPU (as llama.cpp's rpc-server)."""
    return local_devices() or devices_of_type((CPU_TYPE,))[:1]


class ConnectedWorkers:
    """The workers this process has connected to, and those an abort may name. ggml keeps
    both process-wide (its RPC registry, and one abort callback), hence one instance,
    WORKERS."""

    def __init__(self) -> None:
        self._devices: dict[str, list[int]] = {}
        self._watched: list[str] = []

    def devices(self, endpoints: Sequence[str]) -> list[int]:
        """The devices of the workers at `endpoints`, in order, each checked first (rpc.py:
        one line for a worker that is missing, busy or of another protocol, where llama.cpp
        would abort the process)."""
        _refuse_without_rpc()
        self.watch(endpoints)
        devices = []
        for endpoint in endpoints:
            if endpoint not in self._devices:
                self._devices[endpoint] = _connect(endpoint)
            devices += self._devices[endpoint]
        return devices

    def watch(self, endpoints: Sequence[str]) -> None:
        """From now on, an abort names whichever of these workers was lost."""
        self._watched += [endpoint for endpoint in endpoints if endpoint not in self._watched]
        if _set_abort_callback is not None:
            _set_abort_callback(_on_ggml_abort)

    def on_abort(self, message: bytes) -> None:
        """llama.cpp aborts the process when a worker stops answering (its RPC client has no
        other way to fail). Name the worker, keep what was printed, and exit 1 instead. Other
        aborts return here, and ggml aborts as it would have."""
        text = message.decode("utf-8", errors="replace").strip()
        gone = rpc.unreachable(self._watched)
        if not gone and "RPC" not in text:
            return
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        who = (
            f"the worker at {', '.join(gone)}"
            if gone
            else f"a worker (of {', '.join(self._watched)})"
        )
        sys.stderr.write(
            f"\nerror: lost {who} mid-run (llama.cpp: {text.split(': ', 1)[-1]}). What was "
            "printed before stands; restart the worker and run again.\n"
        )
        sys.stderr.flush()
        os._exit(1)


def _connect(endpoint: str) -> list[int]:
    rpc.check_workers([endpoint])
    registry = _rpc_add_server(endpoint.encode())
    count = _reg_dev_count(registry) if registry else 0
    if not count:
        raise rpc.WorkerError(f"the worker at {endpoint} offers no device.")
    return [_reg_dev_get(registry, i) for i in range(count)]


WORKERS = ConnectedWorkers()


@_ABORT_CALLBACK
def _on_ggml_abort(message: bytes) -> None:
    WORKERS.on_abort(message)


def serve_worker(host: str, port: int, threads: int | None, tensor_cache: Path | None) -> None:
    """Serve this machine's devices over llama.cpp's RPC protocol until the process is
    stopped; returns only if llama.cpp's server could not start. The caller has checked
    the address (rpc.check_listen_address) before saying where the worker listens.

    The worker cannot tell a prompt from a draft, so it keeps the batch-invariant kernels for
    every batch of up to EXACT_BATCH_ROWS rows: a verification then computes each of its
    tokens as a one-token decode does, and an exact client's answers stay identical across
    the network. Larger batches (prompt chunks) are cut at fixed positions by the client."""
    _refuse_without_rpc()
    keep_invariant_kernels()
    devices = _served_devices()
    array = (ctypes.c_void_p * len(devices))(*devices)
    cache = str(tensor_cache).encode() if tensor_cache is not None else None
    _rpc_start_server(
        f"{host}:{port}".encode(), cache, threads or default_threads(), len(devices), array
    )
    raise rpc.WorkerError(f"llama.cpp's RPC server could not serve on {host}:{port}.")


def worker_device_names() -> list[str]:
    return [(_dev_description(device) or b"?").decode() for device in _served_devices()]
