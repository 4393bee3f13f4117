"""Greedy choices taken by the device that computes the logits, against the host's argmax of
the rows it sends back (specdec_cli/llama/device_choices.py): what CHOICES_ON_DEVICE should
say for a backend.

Usage: python scripts/choice_costs.py NGL MODEL.gguf [MODEL.gguf ...]   (project importable)

Per model, in exact mode after a 128-token context, three decodes (MEASURES): a target's step
(1 row) and verification (8 rows), every choice read as the oracle's verdicts read them, and
a drafter's step (1 row, its choice and that choice's probability). BLOCKS blocks of each
decode on each side in turn, each after a warm-up (each change of sampler makes llama.cpp
reserve its graphs again), medians of every block's decodes. Prints a line per model, then
one JSON line: {"<model>:choices": {"host_ms": {"1": ms, "8": ms, "step": ms},
"device_ms": {...}, "same_choices": bool}}; the device's probabilities must be the host's
within 1e-4. Last, "greedy choices on the device pay: yes" where every model's choices are
the host's and none of its decodes costs more on the device (else "no"): gpu_device.sh then
runs its benches with them.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from gpu_check import CONTEXT, N_CTX, text_tokens
from gpu_verdict import CHOICE_LABELS

from specdec_cli.decoding.backend import ArgmaxRows, Choices
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.library import system_info

# a name -> rows, and whether the choices' probabilities are read (a drafter's step)
MEASURES = {"1": (1, False), "8": (8, False), "step": (1, True)}
BLOCKS = 4
REPEATS = 10  # per block
WARMUP = 3
CONFIDENCE_TOLERANCE = 1e-4  # relative: the device's softmax against the host's


def decoded(backend: LlamaBackend, side: str, tail: list[int], key: str) -> Choices:
    n, with_confidence = MEASURES[key]
    if side == "host":
        return ArgmaxRows(backend.decode(tail[:n], n))
    return backend.decode_choices(tail[:n], n, with_confidence=with_confidence)


def read(choices: Choices, key: str) -> list[tuple[int, float | None]]:
    """Every choice, with its probability where the measure reads them."""
    n, with_confidence = MEASURES[key]
    return [(choices[i], choices.confidence(i) if with_confidence else None) for i in range(n)]


def block(
    backend: LlamaBackend, side: str, context: list[int], tail: list[int], key: str
) -> tuple[list[float], list[tuple[int, float | None]]]:
    """Seconds of each timed decode of `key` after `context` on one side, everything
    it reads read; and what the last one read."""
    seconds, found = [], []
    for repeat in range(WARMUP + REPEATS):
        backend.truncate(len(context))
        began = time.perf_counter()
        found = read(decoded(backend, side, tail, key), key)
        if repeat >= WARMUP:
            seconds.append(time.perf_counter() - began)
    return seconds, found


def alike(host: list, device: list) -> bool:
    """The same choices, with probabilities within CONFIDENCE_TOLERANCE."""
    return all(
        token == other and (sure is None or abs(sure - other_sure) <= CONFIDENCE_TOLERANCE * sure)
        for (token, sure), (other, other_sure) in zip(host, device, strict=True)
    )


def measure(path: str, ngl: int) -> dict:
    backend = LlamaBackend(path, n_ctx=N_CTX, n_gpu_layers=ngl, exact=True, device_choices=True)
    try:
        tokens = text_tokens(backend)
        context, tail = tokens[:CONTEXT], tokens[CONTEXT:]
        backend.decode(context, 1, prompt=True)
        times: dict[str, dict[str, list[float]]] = {
            side: {key: [] for key in MEASURES} for side in ("host", "device")
        }
        same = True
        for _ in range(BLOCKS):
            for key in MEASURES:
                found = {}
                for side in times:
                    seconds, found[side] = block(backend, side, context, tail, key)
                    times[side][key] += seconds
                same = same and alike(found["host"], found["device"])
        if not backend.chooses_on_device:
            raise RuntimeError("llama.cpp could not take the choices on this device")
    finally:
        backend.close()
    medians = {
        f"{side}_ms": {key: round(1000 * float(np.median(v)), 3) for key, v in by_key.items()}
        for side, by_key in times.items()
    }
    return medians | {"same_choices": same}


def pays(results: dict) -> bool:
    """Whether choices on the device pay: the host's choices, and no decode of any model
    dearer than with its rows sent back (a mixed result keeps them on the host)."""
    return all(
        found["same_choices"]
        and all(found["device_ms"][key] <= found["host_ms"][key] for key in MEASURES)
        for found in results.values()
    )


def main() -> int:
    if len(sys.argv) < 3:
        print("usage: python scripts/choice_costs.py NGL MODEL.gguf [...]", file=sys.stderr)
        return 2
    ngl, paths = int(sys.argv[1]), sys.argv[2:]
    print(system_info()[:200], flush=True)
    results = {}
    for path in paths:
        model = path.rsplit("/", 1)[-1]
        found = results[f"{model}:choices"] = measure(path, ngl)
        host, device = found["host_ms"], found["device_ms"]
        costs = ", ".join(
            f"{CHOICE_LABELS[key]} {host[key]:.3f} ms on the host, {device[key]:.3f} on the device "
            f"({device[key] / host[key]:.2f}x)"
            for key in MEASURES
        )
        print(f"{model}: greedy choices: {costs}; same choices: {found['same_choices']}")
    print(json.dumps(results))
    print(f"greedy choices on the device pay: {'yes' if pays(results) else 'no'}")
    return 0 if all(found["same_choices"] for found in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
