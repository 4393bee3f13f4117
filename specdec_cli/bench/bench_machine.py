"""What a bench report records of the machine and the model files, so that its numbers can
be compared with another run's."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from pathlib import Path

from ..decoding.backend import Backend
from ..request import HardwareOptions


def timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine_info(hardware: HardwareOptions, n_ctx: int) -> dict:
    from ..llama import library  # loaded already by the time a bench runs

    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": hardware.threads or library.default_threads(),
        "memory_bytes": _memory_bytes(),
        "load_average": _load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": library.library_version(),
        "llama_cpp_system_info": library.system_info(),
        "rowwise_kernels": library.rowwise_kernels(),
        "gpu_offload_supported": library.supports_gpu_offload(),
        "gpu_layers": hardware.gpu_layers,
        "draft_gpu_layers": hardware.draft_gpu_layers,
        "rpc": list(hardware.rpc),  # the target's layers on these workers
        "tensor_split": list(hardware.tensor_split),
        "ctx_size": n_ctx,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def model_record(backend: Backend, path: Path) -> dict:
    from ..models.checksums import cached_sha256

    record = {
        "path": str(path),
        "file": path.name,
        "size_bytes": path.stat().st_size,
        "sha256": cached_sha256(path),
    }
    info = backend.describe()
    record.update(
        description=info.get("description"),
        parameters=info.get("parameters"),
        n_vocab=info.get("n_vocab"),
    )
    return record
