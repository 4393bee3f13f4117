"""Which operation first makes a token's values depend on its batch, on any backend (a GPU's
too): where gpu_check.py finds exact rows that differ, this says where in the model.

Usage: python scripts/batch_op_diff.py [--fast] [--long] NGL MODEL.gguf N   (project importable)

Decodes gpu_check.py's 128-token context (--long: its 3000 tokens), then the next token alone
and as the first of N tokens, in exact mode (--fast: llama.cpp's kernels), and compares that
token's values:
first every layer's output and the final norm and logits, read where llama.cpp computes them
(the scheduler runs each stretch between two of them as in a plain decode, fusions included);
then, in the first layer that differs, every operation, each computed on its own (so fusions
inside the layer are off: where none of its operations differs then, a fusion is the suspect).
Exits 0 where nothing differs, 1 where something does.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import numpy as np
from gpu_check import CONTEXT, LONG_CONTEXT, N_CTX, text_tokens

from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.tensors import Recorded, TensorRecorder

SHOWN = 6  # differing operations printed
OUTPUTS = ("result_norm", "result_output")
LAYER = re.compile(r"-(\d+)$")


def layer_outputs(name: str) -> bool:
    return name.startswith("l_out-") or name in OUTPUTS


def first_token(
    path: str, ngl: int, exact: bool, length: int, n: int, wanted: Callable[[str], bool]
):
    """The wanted tensors' first columns with the token after `length` tokens of context
    alone, and as the first of n."""
    recorder = TensorRecorder(wanted)
    backend = LlamaBackend(
        path, n_ctx=N_CTX, n_gpu_layers=ngl, exact=exact, verify_padding=1,
        eval_callback=recorder.callback,
    )  # fmt: skip
    try:
        tokens = text_tokens(backend)
        context, tail = tokens[:length], tokens[length : length + n]
        backend.decode(context, 1, prompt=True)
        runs = []
        for size in (1, n):
            backend.truncate(len(context))
            recorder.recorded.clear()
            backend.decode(tail[:size], size)  # every row's logits: the first is the token's
            runs.append(list(recorder.recorded))
        return runs
    finally:
        backend.close()


def differing(alone: list[Recorded], batched: list[Recorded]) -> list[tuple[Recorded, float]]:
    """The tensors whose first column differs between the runs, in the order computed."""
    found = []
    for a, b in zip(alone, batched, strict=False):
        if a.name != b.name:
            raise SystemExit(f"the two decodes' graphs part at {a.name} / {b.name}")
        if a.first_column.shape == b.first_column.shape and not np.array_equal(
            a.first_column, b.first_column
        ):
            found.append((a, float(np.abs(a.first_column - b.first_column).max())))
    return found


def describe(recorded: Recorded, diff: float) -> str:
    shape = "x".join(str(d) for d in recorded.shape if d != 1) or "1"
    scale = float(np.abs(recorded.first_column).max())
    where = f"{recorded.name} ({recorded.op}, {shape})"
    return f"{where}: max|diff| {diff:.3g} of values up to {scale:.3g}"


def main() -> int:
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ngl, path, n = int(args[0]), args[1], int(args[2])
    exact, length = "--fast" not in flags, LONG_CONTEXT if "--long" in flags else CONTEXT
    mode = "exact" if exact else "fast"
    label = f"{path.rsplit('/', 1)[-1]} {mode}, a token after {length} alone and first of {n}"
    found = differing(*first_token(path, ngl, exact, length, n, layer_outputs))
    if not found:
        print(f"{label}: every layer's output and the logits the same bits")
        return 0
    first, diff = found[0]
    print(f"{label}: first differing {describe(first, diff)}")
    layer = LAYER.search(first.name)
    suffix = f"-{layer.group(1)}" if layer else None

    def in_stage(name: str) -> bool:  # that layer's tensors, or the output stage's
        return name.endswith(suffix) if suffix else LAYER.search(name) is None

    ops = differing(*first_token(path, ngl, exact, length, n, in_stage))
    stage = f"layer {layer.group(1)}" if layer else "the output stage"
    if not ops:
        print(f"  in {stage}, each operation computed on its own: none differs (a fusion?)")
    for recorded, op_diff in ops[:SHOWN]:
        print(f"  in {stage}, each operation computed on its own: {describe(recorded, op_diff)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
