"""Exact mode's decode costs on the CPU by context length, with specdec's attention kernel
(patch 0002, native/rowwise/attention.c) and with llama.cpp's one-row path it replaces, and
llama.cpp's own kernels (--fast) beside them: one process, the three interleaved round by round,
medians. Also a 1024-token prompt's first pass with the invariant prompt kernels (as exact mode
decodes prompts where INVARIANT_PROMPT_ISAS holds), in 128-token chunks, and with --fast.

    .venv/bin/python docs/measurements/experiments/attention_costs.py MODEL.gguf [ROUNDS]
"""

import sys
import time

import numpy as np

from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend

TEXT = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip()\n" * 200
CONTEXTS = (64, 1000, 3000)
ROWS = (1, 8)
PROMPT_TOKENS = 1024
SIDES = ("kernel", "one-row path", "fast")


def decode_ms(backend: LlamaBackend, tokens: list[int], base: int, rows: int) -> float:
    backend.truncate(base)
    start = time.perf_counter()
    backend.decode(tokens[base : base + rows], rows)
    return 1000 * (time.perf_counter() - start)


def prompt_ms(backend: LlamaBackend, tokens: list[int]) -> float:
    backend.truncate(0)
    start = time.perf_counter()
    backend.decode(tokens[:PROMPT_TOKENS], 1, prompt=True)
    return 1000 * (time.perf_counter() - start)


def main() -> None:
    path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    exact = LlamaBackend(path, n_ctx=4096, exact=True)
    fast = LlamaBackend(path, n_ctx=4096, exact=False)
    tokens = exact.tokenize(TEXT, add_special=True)
    times: dict[tuple, list[float]] = {}
    for base in CONTEXTS:
        for backend in (exact, fast):
            backend.truncate(0)
            backend.decode(tokens[:base], 1, prompt=True)
        for round_ in range(rounds + 1):  # the first round warms up
            # each side in turn goes first, right after a switch of context (its threads and
            # caches cold): with one fixed order the first side alone paid for it
            for side in SIDES[round_ % 3 :] + SIDES[: round_ % 3]:
                library.use_specdec_attention(side != "one-row path")
                backend = fast if side == "fast" else exact
                for rows in ROWS:
                    took = decode_ms(backend, tokens, base, rows)
                    if round_:
                        times.setdefault((base, rows, side), []).append(took)
    library.use_specdec_attention(True)
    for round_ in range(rounds):
        for side, invariant in (("invariant kernels", True), ("128-token chunks", False)):
            library._invariant_prompts = invariant
            times.setdefault(("prompt", side), []).append(prompt_ms(exact, tokens))
        times.setdefault(("prompt", "fast"), []).append(prompt_ms(fast, tokens))
    exact.close()
    fast.close()
    print(f"{path.rsplit('/', 1)[-1]}, ms (medians of {rounds}); {library.system_info()[:60]}")
    print("context | rows | " + " | ".join(SIDES))
    for base in CONTEXTS:
        for rows in ROWS:
            cells = [f"{np.median(times[(base, rows, side)]):.1f}" for side in SIDES]
            print(f"{base} | {rows} | " + " | ".join(cells))
    cells = [f"{key[1]} {np.median(v):.0f}" for key, v in times.items() if key[0] == "prompt"]
    print(f"a {PROMPT_TOKENS}-token prompt's first pass: " + ", ".join(cells))


if __name__ == "__main__":
    main()
