"""Exact mode on a GPU: batch invariance and decode costs of GGUF models, all layers offloaded.

Usage: python scripts/gpu_check.py [--exact] [--quick] NGL MODEL.gguf [MODEL.gguf ...]
(project importable)
--exact: exact mode alone (as when SPECDEC_CUDA_FATTN_ROWS=1 puts its attention on patch 0006's
kernel, which fast mode never takes).
--quick: every timing once, no warm-up: the checks alone, in seconds (whether a kernel's hook
works in a model before the runs that time it).

Per model and mode (exact, then fast): decode a 128-token context, then n tokens one at a time
and the same n tokens in one batch (n = 2..32); print the largest logit difference, how many
rows are bit-identical and how many keep the same top token. Then the steady cost of a decode
of n tokens (the same n again and again: CUDA graphs stay captured), and the cost of n=1 and of
n=8 when they alternate, as a drafter's steps and a target's verifications do in one context,
and of the sizes a speculative run's decodes take one after another (RUN_PATTERN), plain and
padded to multiples of 8 rows (exactness.padded_rows: verifications only, a single token stays
one row), each against its shape's steady cost: whether padding keeps every decode within 10%
of it, and what it costs; with how many of those decodes reused a graph (patch 0005). Last, a
1024-token prompt's pass from an empty cache (exact mode cuts it into PROMPT_CHUNKs, llama.cpp's
kernels take it in n_batch). Then the same at LONG_CONTEXT tokens of context: invariance,
and the steady cost of n = 1 and 8, where attention is what grows with a verification's rows.
Last, exact mode's rows decoded one at a time against llama.cpp's own kernels' (fast mode; with
--exact, a fast-mode pass of just those rows): a kernel that is invariant but wrong would pass
everything else with random weights, whose text nobody reads.
Exits non-zero if an exact row differs, or exact mode's logits part from llama.cpp's. Prints
one JSON line per model once it is measured (its keys "<model>:exact" and "<model>:fast"), so
that a run cut short keeps the models it finished. SPECDEC_CUDA_MMV_TC=1
runs exact mode's Q4_K, Q6_K and Q8_0 products on specdec's tensor-core kernel (patch 0004).

Run by the GPU kit (scripts/gpu/device.sh) on a machine with a GPU; see README (GPUs).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.exactness import padded_rows
from specdec_cli.llama.library import cuda_attention, cuda_products, system_info

TEXT = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip()\n" * 12
CONTEXT = 128
INVARIANCE_SIZES = (2, 3, 4, 5, 8, 9, 16, 17, 32)  # AGREEMENT_ROWS among them
LONG_INVARIANCE_SIZES = (2, 8, 9, 16)
COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 16, 32, 64)
REPEATS = 20
RUN_PATTERN = (1, 3, 6, 2, 8, 5, 1, 4)  # a target's decodes in a run: steps and verifications
PADDING = 8
WARMUP = 3
PROMPT_TOKENS = 1024
PROMPT_REPEATS = 3
LONG_CONTEXT = 3000  # as the CPU's attention was measured (docs/exactness.md, "Attention")
N_CTX = 4096
# Exact mode's logits against llama.cpp's kernels', rows decoded alone: the least correlation
# of a row's logits. Random weights amplify a summation order's last bits through the layers
# (on the Zen 4's CPU, 0.5B shape: 0.987-0.992 exact against fast, 0.991 llama.cpp's own
# batch against its single rows at 1,000 tokens; a real Qwen 0.5B 0.9996); a wrong stride,
# scale or mask in a kernel's hook gives unrelated logits, far below. At least AGREEMENT_MIN,
# or where llama.cpp's own batch of the same rows parts further from its single rows (a GPU
# whose kernels change more with the batch), within AGREEMENT_SLACK times that distance.
AGREEMENT_MIN = 0.9
AGREEMENT_SLACK = 3.0
AGREEMENT_ROWS = 8


def text_tokens(backend: LlamaBackend) -> list[int]:
    """The checks' text in `backend`'s tokens: LONG_CONTEXT of them and more."""
    return backend.tokenize(TEXT * 15, add_special=True)


def alone_and_batched(backend: LlamaBackend, context: list[int], tail: list[int]) -> dict:
    """The logits of `tail`'s tokens decoded after `context` one at a time ("alone") and in
    one batch ("batch")."""
    backend.truncate(len(context))
    alone = np.vstack([np.array(backend.decode([t], 1)) for t in tail])
    backend.truncate(len(context))
    return {"alone": alone, "batch": np.array(backend.decode(tail, len(tail)))}


def correlations(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's Pearson correlation between two matrices of logits."""
    a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    return (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))


def invariance(
    backend: LlamaBackend, context: list[int], tail: list[int], sizes
) -> tuple[dict, dict]:
    """Per n in `sizes`, how `tail`'s first n tokens decoded alone and in one batch compare;
    and the logits of those of AGREEMENT_ROWS tokens (alone_and_batched), for `agreement`."""
    out, kept = {}, {}
    for n in sizes:
        decoded = alone_and_batched(backend, context, tail[:n])
        if n == AGREEMENT_ROWS:
            kept = decoded
        single, batch = decoded["alone"], decoded["batch"]
        diff = np.abs(single - batch).max(axis=1)
        out[n] = {
            "max_diff": float(diff.max()),
            "rows_identical": int((diff == 0).sum()),
            "same_argmax": int((single.argmax(1) == batch.argmax(1)).sum()),
            "min_correlation": float(correlations(single, batch).min()),
        }
    return out, kept


def timed(backend: LlamaBackend, context: list[int], tail: list[int], pattern) -> dict:
    """Median milliseconds of a decode of each n in `pattern`, run in that order."""
    times: dict[int, list[float]] = {n: [] for n in set(pattern)}
    for repeat in range(REPEATS + WARMUP):
        for n in pattern:
            backend.truncate(len(context))
            start = time.perf_counter()
            backend.decode(tail[:n], n)
            if repeat >= WARMUP:
                times[n].append(time.perf_counter() - start)
    return {n: round(1000 * float(np.median(v)), 3) for n, v in times.items()}


def timed_phase(found: dict, key: str, backend: LlamaBackend, context, tail, pattern) -> None:
    """`timed` as found[key_ms], and how many of its decodes reused a graph (patch 0005 keeps
    one per shape) as found[key_graphs_reused]."""
    before = backend.graphs_reused()
    found[f"{key}_ms"] = timed(backend, context, tail, pattern)
    decodes = len(pattern) * (REPEATS + WARMUP)
    found[f"{key}_graphs_reused"] = f"{backend.graphs_reused() - before}/{decodes}"


def prompt_ms(backend: LlamaBackend, prompt: list[int]) -> float:
    """Median milliseconds of a first pass over `prompt` from an empty cache, after one."""
    times = []
    for repeat in range(PROMPT_REPEATS + 1):
        backend.truncate(0)
        start = time.perf_counter()
        backend.decode(prompt, 1, prompt=True)
        if repeat:
            times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 3)


def long_context(backend: LlamaBackend, tokens: list[int], rows: dict) -> dict:
    """Invariance and the steady cost of a step and of a verification of 8 rows at
    LONG_CONTEXT tokens of context; its single rows as rows["long"]."""
    context, tail = tokens[:LONG_CONTEXT], tokens[LONG_CONTEXT : LONG_CONTEXT + 32]
    backend.truncate(0)
    backend.decode(context, 1, prompt=True)
    found, rows["long"] = invariance(backend, context, tail, LONG_INVARIANCE_SIZES)
    return {
        "context": LONG_CONTEXT,
        "invariance": found,
        "steady_ms": {n: timed(backend, context, tail, [n])[n] for n in (1, 8)},
    }


def against_steady(run_ms: dict, steady_ms: dict, padding: int) -> dict:
    """Each decode of a run against the steady cost of the shape it took: n rows padded as
    the backend pads them (exactness.padded_rows)."""
    return {
        n: round(ms / steady_ms[padded_rows(n, padding)], 3) for n, ms in sorted(run_ms.items())
    }


def check(path: str, ngl: int, exact: bool) -> tuple[dict, dict]:
    """What gpu_check measures of one model in one mode, and the logits of AGREEMENT_ROWS
    tokens decoded alone, at 128 tokens of context ("short") and at LONG_CONTEXT ("long")."""
    # Unpadded whatever this backend pads by default: each shape's own cost, then padding's.
    backend = LlamaBackend(path, n_ctx=N_CTX, n_gpu_layers=ngl, exact=exact, verify_padding=1)
    try:
        tokens = text_tokens(backend)
        context, tail = tokens[:CONTEXT], tokens[CONTEXT : CONTEXT + 64]
        backend.decode(context, 1, prompt=True)
        short, kept = invariance(backend, context, tail, INVARIANCE_SIZES)
        found, rows = {"invariance": short}, {"short": kept}
        found["steady_ms"] = {n: timed(backend, context, tail, [n])[n] for n in COST_SIZES}
        timed_phase(found, "alternating", backend, context, tail, [1, 8])
        timed_phase(found, "run", backend, context, tail, RUN_PATTERN)
        found["run_against_steady"] = against_steady(found["run_ms"], found["steady_ms"], 1)
        if exact:
            backend.verify_padding = PADDING
            timed_phase(found, "padded_run", backend, context, tail, RUN_PATTERN)
            found["padded_run_against_steady"] = against_steady(
                found["padded_run_ms"], found["steady_ms"], PADDING
            )
        found["prompt_ms"] = {PROMPT_TOKENS: prompt_ms(backend, tokens[:PROMPT_TOKENS])}
        found["long_context"] = long_context(backend, tokens, rows)
        return found, rows
    finally:
        backend.close()


def fast_rows(path: str, ngl: int) -> dict:
    """check()'s single rows in fast mode, without the rest: --exact's reference."""
    backend = LlamaBackend(path, n_ctx=N_CTX, n_gpu_layers=ngl, exact=False)
    try:
        tokens = text_tokens(backend)
        rows = {}
        for key, length in (("short", CONTEXT), ("long", LONG_CONTEXT)):
            backend.truncate(0)
            backend.decode(tokens[:length], 1, prompt=True)
            tail = tokens[length : length + AGREEMENT_ROWS]
            rows[key] = alone_and_batched(backend, tokens[:length], tail)
        return rows
    finally:
        backend.close()


def agreement(exact: dict, fast: dict) -> dict:
    """Exact mode's rows decoded alone against fast mode's, at each context, beside fast
    mode's own batch against its rows alone."""
    out = {}
    for key, found in exact.items():
        rows, reference = found["alone"], fast[key]["alone"]
        own = float(correlations(fast[key]["batch"], reference).min())
        out[key] = {
            "min_correlation": float(correlations(rows, reference).min()),
            "max_diff": float(np.abs(rows - reference).max()),
            "logit_std": float(reference.std(axis=1).mean()),
            "same_argmax": int((rows.argmax(1) == reference.argmax(1)).sum()),
            "rows": len(rows),
            "own_correlation": own,
            "least_allowed": min(AGREEMENT_MIN, 1.0 - AGREEMENT_SLACK * (1.0 - own)),
        }
    return out


def report_agreement(key: str, found: dict) -> list[str]:
    """Prints exact mode's agreement with llama.cpp's kernels; the contexts where it fails."""
    failures = []
    for where, r in found.items():
        print(
            f"{key} against llama.cpp's kernels, {r['rows']} rows alone, {where} context:"
            f" least correlation {r['min_correlation']:.4f}, max|diff| {r['max_diff']:.3g}"
            f" (logits' std {r['logit_std']:.3g}), same top token {r['same_argmax']}/{r['rows']};"
            f" llama.cpp's batch against its rows alone {r['own_correlation']:.4f},"
            f" least allowed {r['least_allowed']:.4f}",
            flush=True,
        )
        if not r["min_correlation"] >= r["least_allowed"]:  # NaN fails too
            failures.append(f"{key} {where} context: correlation {r['min_correlation']:.4f}")
    return failures


def report_invariance(invariance: dict) -> None:
    for n, r in invariance.items():
        print(
            f"  n={n:2d} max|diff| {r['max_diff']:.3g}  identical rows {r['rows_identical']}/{n}"
            f"  same top token {r['same_argmax']}/{n}  least correlation {r['min_correlation']:.4f}"
        )


def report(key: str, found: dict) -> None:
    print(key, flush=True)
    report_invariance(found["invariance"])
    steady = found["steady_ms"]
    print("  steady ms by n:", " ".join(f"{n}:{v}" for n, v in steady.items()))
    print("  as multiples of n=1:", " ".join(f"{n}:{v / steady[1]:.2f}" for n, v in steady.items()))
    alternating = found["alternating_ms"]
    print(
        f"  n=1 and n=8 alternating: {alternating[1]} and {alternating[8]} ms,"
        f" graphs reused {found['alternating_graphs_reused']}",
        flush=True,
    )
    for key in ("run", "padded_run"):
        if f"{key}_ms" in found:
            ratios = " ".join(
                f"{n}:{found[f'{key}_ms'][n]}/{ratio:.2f}x"
                for n, ratio in found[f"{key}_against_steady"].items()
            )
            print(f"  {key}_ms (ms / against its shape's steady cost): {ratios}", flush=True)
            print(f"  {key} graphs reused: {found[f'{key}_graphs_reused']}", flush=True)
    print(f"  first pass of a {PROMPT_TOKENS}-token prompt: {found['prompt_ms'][PROMPT_TOKENS]} ms")
    long = found["long_context"]
    print(f"  at {long['context']} tokens of context:")
    report_invariance(long["invariance"])
    step, verify = long["steady_ms"][1], long["steady_ms"][8]
    print(f"  steady ms: n=1 {step}, n=8 {verify} ({verify / step:.2f}x)", flush=True)


def differing_rows(key: str, found: dict) -> list[str]:
    """The invariance checks (short and long context) where an exact row differed."""
    checks = [("", found["invariance"]), (" long", found["long_context"]["invariance"])]
    return [
        f"{key}{where} n={n}"
        for where, invariance in checks
        for n, r in invariance.items()
        if r["rows_identical"] != n
    ]


def main() -> int:
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    modes = (True,) if "--exact" in flags else (True, False)
    if "--quick" in flags:
        global REPEATS, WARMUP, PROMPT_REPEATS
        REPEATS, WARMUP, PROMPT_REPEATS = 1, 0, 1
    ngl, paths = int(args[0]), args[1:]
    print(system_info()[:200], flush=True)
    print(f"exact mode's Q4_K/Q6_K/Q8_0 products on CUDA: {cuda_products()}", flush=True)
    print(f"exact mode's attention on CUDA: {cuda_attention()}", flush=True)
    results, failures, parted = {}, [], []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        rows = {}
        for exact in modes:
            key = f"{name}:{'exact' if exact else 'fast'}"
            results[key], rows[exact] = check(path, ngl, exact)
            report(key, results[key])
            if exact:
                failures += differing_rows(key, results[key])
        fast = rows[False] if False in rows else fast_rows(path, ngl)
        found = results[f"{name}:exact"]["agrees_with_fast"] = agreement(rows[True], fast)
        parted += report_agreement(f"{name}:exact", found)
        print(json.dumps({key: results[key] for key in results if key.startswith(f"{name}:")}))
    print("exact rows differ:", ", ".join(failures) if failures else "none")
    print("exact logits part from llama.cpp's:", ", ".join(parted) if parted else "none")
    return 1 if failures or parted else 0


if __name__ == "__main__":
    sys.exit(main())
