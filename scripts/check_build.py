"""The last step of `make install`: does the llama.cpp just built work, and is exact mode exact?

Writes a tiny GGUF model (tests/tiny_gguf.py), loads it with every layer on the GPU where the
build has one, decodes four tokens one at a time and then together in exact mode, and says what
ran where. Fails with one line (exit 1) where the build lacks specdec's patches, was built for a
GPU it cannot find here, cannot load or decode a model, or gives a token other logits inside a
batch than alone.

Usage: python scripts/check_build.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tiny_gguf import TinyConfig, write_tiny_llama  # noqa: E402

from specdec_cli.errors import SpecdecError  # noqa: E402
from specdec_cli.llama import library  # noqa: E402
from specdec_cli.llama.backend import LlamaBackend  # noqa: E402

# K-quant rows of 256 and Q8_0: the products take MMVQ on a GPU, as real models' do
CONFIG = TinyConfig(n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
TOKENS = 4
FIX = "Rebuild with `make rebuild-llama` (README: GPUs); --verbose shows llama.cpp's log."


def tiny_model(folder: Path) -> Path:
    """The check's model, written in `folder`."""
    return write_tiny_llama(folder / "check.gguf", config=CONFIG, quant="q4_k_m")


def check(model: Path, gpu: bool) -> None:
    layers = -1 if gpu else 0
    backend = LlamaBackend(model, n_ctx=128, n_gpu_layers=layers, exact=True)
    try:
        prompt = backend.tokenize("the cat sat on the mat", add_special=True)
        backend.decode(prompt, 1, prompt=True)
        tokens = list(range(300, 300 + TOKENS))
        alone = np.vstack([np.array(backend.decode([t], 1)) for t in tokens])
        backend.truncate(len(prompt))
        together = np.array(backend.decode(tokens, TOKENS))
    finally:
        backend.close()
    if not np.isfinite(alone).all():
        raise SystemExit(f"error: the {'GPU' if gpu else 'CPU'} decoded non-finite logits. {FIX}")
    if not np.array_equal(alone, together):
        raise SystemExit(
            "error: exact mode's kernels are not batch-invariant in this build "
            f"({'GPU' if gpu else 'CPU'}): a token's logits differ inside a batch. {FIX}"
        )


def main() -> None:
    exactness = library._exactness
    if not library.has_invariant_kernels():
        missing = ", ".join(exactness.missing_in_build())
        raise SystemExit(f"error: llama.cpp was built without specdec's patches ({missing}). {FIX}")
    unseen = exactness.gpu_backends_without_device
    if unseen:
        names = "+".join(unseen)
        look = ": `nvidia-smi` lists the GPUs CUDA sees" if "CUDA" in unseen else ""
        raise SystemExit(
            f"error: this llama.cpp was built for {names} but finds no {names} device here (no "
            f"driver loaded, or no GPU visible{look}). Run it where the GPU is, or build for "
            "the CPU: `make rebuild-llama` without SPECDEC_CMAKE_ARGS."
        )
    gpus = exactness.gpu_backends
    with tempfile.TemporaryDirectory() as folder:
        model = tiny_model(Path(folder))
        try:
            check(model, gpu=False)
            if gpus and not exactness.inexact_gpu_backends():
                check(model, gpu=True)
        except SpecdecError as error:
            raise SystemExit(f"error: {error} {FIX}") from error
    where = f"a tiny model decoded on {'+'.join(gpus)}" if gpus else "no GPU backend"
    inexact = exactness.inexact_gpu_backends()
    note = f" (none on {', '.join(inexact)}: exact needs --gpu-layers 0)" if inexact else ""
    print(
        f"llama-cpp-python {library.library_version()} ready, {where}, "
        f"batch-invariant kernels: {exactness.signature()}{note}"
    )


if __name__ == "__main__":
    main()
