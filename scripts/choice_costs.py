"""Greedy choices taken by the device that computes the logits, against the host's argmax of
the rows it sends back (specdec_cli/llama/device_choices.py): what CHOICES_ON_DEVICE should
say for a backend.

Usage: python scripts/choice_costs.py NGL MODEL.gguf [MODEL.gguf ...]   (project importable)

Per model, in exact mode after a 128-token context: a step (1 row) and a verification (8 rows)
with every choice read, as the oracle's verdicts read them; BLOCKS blocks of each side in
turn, each after a warm-up (each change makes llama.cpp reserve its graphs again), medians
of every block's decodes. Prints a line per model, then one JSON line:
{"<model>:choices": {"host_ms": {"1": ms, "8": ms}, "device_ms": {...}, "same_choices": bool}}.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

import numpy as np
from gpu_check import CONTEXT, N_CTX, text_tokens

from specdec_cli.decoding.backend import ArgmaxRows, Choices
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.library import system_info

ROWS = (1, 8)
BLOCKS = 4
REPEATS = 10  # per block and shape
WARMUP = 3


def host_choices(backend: LlamaBackend, tokens: Sequence[int], n: int) -> Choices:
    return ArgmaxRows(backend.decode(tokens, n))


def device_choices(backend: LlamaBackend, tokens: Sequence[int], n: int) -> Choices:
    return backend.decode_choices(tokens, n)


SIDES = {"host": host_choices, "device": device_choices}


def block(backend: LlamaBackend, side: str, context: list[int], tail: list[int]) -> dict:
    """Seconds of each decode of ROWS rows after `context` on one side, every choice read;
    and the choices of the last of each."""
    times: dict[int, list[float]] = {n: [] for n in ROWS}
    chosen = {}
    for repeat in range(WARMUP + REPEATS):
        for n in ROWS:
            backend.truncate(len(context))
            began = time.perf_counter()
            choices = SIDES[side](backend, tail[:n], n)
            chosen[n] = [choices[i] for i in range(n)]
            if repeat >= WARMUP:
                times[n].append(time.perf_counter() - began)
    return {"times": times, "chosen": chosen}


def measure(path: str, ngl: int) -> dict:
    backend = LlamaBackend(path, n_ctx=N_CTX, n_gpu_layers=ngl, exact=True, device_choices=True)
    try:
        tokens = text_tokens(backend)
        context, tail = tokens[:CONTEXT], tokens[CONTEXT:]
        backend.decode(context, 1, prompt=True)
        times: dict[str, dict[int, list[float]]] = {side: {n: [] for n in ROWS} for side in SIDES}
        chosen: dict[str, dict] = {}
        for _ in range(BLOCKS):
            for side in SIDES:
                found = block(backend, side, context, tail)
                for n in ROWS:
                    times[side][n] += found["times"][n]
                chosen[side] = found["chosen"]
        if not backend.chooses_on_device:
            raise RuntimeError("llama.cpp could not take the choices on this device")
    finally:
        backend.close()
    medians = {
        f"{side}_ms": {n: round(1000 * float(np.median(times[side][n])), 3) for n in ROWS}
        for side in SIDES
    }
    return medians | {"same_choices": chosen["host"] == chosen["device"]}


def main() -> int:
    if len(sys.argv) < 3:
        print("usage: python scripts/choice_costs.py NGL MODEL.gguf [...]", file=sys.stderr)
        return 2
    ngl, paths = int(sys.argv[1]), sys.argv[2:]
    print(system_info()[:200], flush=True)
    results = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        found = results[f"{name}:choices"] = measure(path, ngl)
        host, device = found["host_ms"], found["device_ms"]
        costs = ", ".join(
            f"{n} rows {host[n]:.3f} ms on the host, {device[n]:.3f} on the device "
            f"({device[n] / host[n]:.2f}x)"
            for n in ROWS
        )
        print(f"{name}: greedy choices: {costs}; same choices: {found['same_choices']}")
    print(json.dumps(results))
    return 0 if all(found["same_choices"] for found in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
