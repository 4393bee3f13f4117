"""llama.cpp in this process: the library's one-time set-up (logs, backend), what a build
has (devices, exact mode's kernels, row-wise kernels), the thread every decode runs on, and
the constants exact decoding shares. Its module state is the process's: llama.cpp keeps one
log callback and one kernel switch per backend for the whole process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import BadUsageError, ModelFileError
from .exactness import GPU_TYPES, VERIFY_PADDING, Exactness, registered_devices


def _library_error(exc: Exception) -> ModelFileError:
    """llama-cpp-python missing, or its shared library not loadable: from the install, or
    from LLAMA_CPP_LIB_PATH (a native build of one's own) naming a folder without one."""
    folder = os.environ.get("LLAMA_CPP_LIB_PATH")
    if folder is not None:
        return ModelFileError(
            f"llama.cpp's library does not load from LLAMA_CPP_LIB_PATH={folder!r} ({exc}).",
            "Point LLAMA_CPP_LIB_PATH at a folder with libllama.so and its libggml*.so "
            "(a build of the patched vendor/llama.cpp), or unset it to use the installed one.",
        )
    return ModelFileError(
        f"llama-cpp-python is not installed or failed to load ({exc}).",
        "Run `make install` (it builds llama-cpp-python with flags safe for this CPU).",
    )


try:
    import llama_cpp
# llama_cpp raises FileNotFoundError or RuntimeError where its library is missing or broken
except (ImportError, OSError, RuntimeError) as exc:  # pragma: no cover - depends on the install
    raise _library_error(exc) from exc

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


def devices_of_type(types: tuple[int, ...]) -> list[int]:
    """ggml's registered devices of these types (exactness.registered_devices)."""
    return [device for device, kind, _ in registered_devices(native_function) if kind in types]


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


def use_specdec_attention(enabled: bool) -> bool:
    """Whether exact mode's batches take specdec's attention kernel on the CPU (patch 0002, on by
    default) or llama.cpp's one-row path, process-wide: for comparing the two. False where the
    build has no such kernel."""
    switch = native_function("ggml_cpu_specdec_set_attention", [ctypes.c_bool], None)
    if switch is not None:
        switch(enabled)
    return switch is not None


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


def verify_padding(on_gpu: bool) -> int:
    """The multiple of rows a verification is padded to where a model's layers run
    (exactness.VERIFY_PADDING; SPECDEC_VERIFY_PADDING overrides it, to measure)."""
    override = os.environ.get("SPECDEC_VERIFY_PADDING", "").strip()
    if not override:
        return VERIFY_PADDING.get(_exactness.layers_backend(on_gpu), 1)
    if not override.isdigit() or not 1 <= int(override) <= EXACT_BATCH_ROWS:
        raise BadUsageError(
            f"SPECDEC_VERIFY_PADDING must be a number of rows from 1 to {EXACT_BATCH_ROWS}, "
            f"not '{override}'.",
            "Unset it, or set it to 8 to pad each verification to a multiple of 8 rows.",
        )
    return int(override)


def cuda_products() -> str:
    """The kernel exact mode's Q4_K, Q6_K and Q8_0 products take on CUDA: "tensor-cores" (specdec's
    native/cuda/mmv_tc.cu, patch 0004) where SPECDEC_CUDA_MMV_TC=1, else "mmvq" (patch 0003)."""
    on = _cuda_opt_in("SPECDEC_CUDA_MMV_TC", "specdec's tensor-core products")
    return "tensor-cores" if on else "mmvq"


def cuda_attention() -> str:
    """The kernel exact mode's attention takes on CUDA: "rows" (specdec's
    native/cuda/fattn_rows.cu, patch 0006) where SPECDEC_CUDA_FATTN_ROWS=1, else "vector"
    (patch 0003's vector kernel)."""
    on = _cuda_opt_in("SPECDEC_CUDA_FATTN_ROWS", "specdec's attention kernel")
    return "rows" if on else "vector"


def _cuda_opt_in(variable: str, kernel: str) -> bool:
    """An opt-in CUDA kernel's switch (off unless set, until the kernel is measured on a GPU).
    The library reads the variable at the kernel's first use and takes exactly "1" as on, so
    no other value may pass for it here: costs and caches would be keyed by a kernel that did
    not run."""
    switch = os.environ.get(variable, "")
    if switch not in ("", "0", "1"):
        raise BadUsageError(
            f"{variable} must be 1 ({kernel}) or 0, not '{switch}'.",
            f"Unset it, or set it to 1 to measure {kernel}.",
        )
    return switch == "1"


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
        if exact and "CUDA" in _exactness.gpu_backends:
            parts.append(f"cuda-products={cuda_products()}")
            parts.append(f"cuda-attention={cuda_attention()}")
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
