"""What a trimmed output head would save and lose for a drafter of the target's vocabulary
(issue 25 item 4a), measured without the llama.cpp patch it would need.

    .venv/bin/python docs/measurements/experiments/trimmed_head_costs.py BENCH.json [BENCH.json ...] [--repeats N]

Saves: one decode of one token with its logits (the head computed) against one without an
output row (llama.cpp then skips the head), interleaved with the target's exact step; a
head of K rows costs about K / n_vocab of the full one. Loses: the share of the target's own
answers (the texts of `specdec bench --json` reports) outside the first K token ids (Qwen's
ids follow the BPE merge order, a frequency order), which a trimmed head cannot propose.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from specdec_cli.llama.backend import LlamaBackend

MODELS = Path.home() / ".cache" / "specdec" / "models"
CONTEXT = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip()\n" * 12
TRIMS = (16_384, 32_768, 65_536)


def step_ms(backend: LlamaBackend, context: list[int], with_head: bool) -> float:
    backend.truncate(len(context) - 1)
    start = time.perf_counter()
    if with_head:
        backend.decode(context[-1:], 1)
    else:  # no logit row: the one decode the public API does not offer, for this measurement
        backend._decode_chunk(context[-1:], 0)
    return 1000 * (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--target", default=MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--drafter", default=MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    args = parser.parse_args()
    target = LlamaBackend(args.target, n_ctx=1024, exact=True)
    drafter = LlamaBackend(args.drafter, n_ctx=1024)
    contexts = {}
    for backend in (target, drafter):
        contexts[backend] = backend.tokenize(CONTEXT, add_special=True)[:129]
        backend.decode(contexts[backend][:-1], 1)
    cases = {"target": (target, True), "drafter": (drafter, True), "no head": (drafter, False)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (backend, with_head) in cases.items():
            times[name].append(step_ms(backend, contexts[backend], with_head))
    ms = {name: float(np.median(values)) for name, values in times.items()}
    head = ms["drafter"] - ms["no head"]
    for name, value in ms.items():
        print(f"{name:8s} {value:6.1f} ms  {value / ms['target']:.2f} of the target's exact step")
    print(f"head     {head:6.1f} ms  {head / ms['drafter']:.0%} of the drafter's step")
    runs = [run for report in args.reports for run in json.loads(report.read_text())["runs"]]
    texts = {run["text"] for run in runs}
    ids = np.array([t for text in texts for t in target.tokenize(text, add_special=False)])
    print(f"{len(texts)} answers, {len(ids)} tokens")
    for k in TRIMS:
        trimmed = ms["no head"] + head * k / drafter.n_vocab
        print(f"K={k:6d}: drafter step {trimmed:5.1f} ms ({trimmed / ms['target']:.2f}), "
              f"answer tokens outside the head {np.mean(ids >= k):.1%}")


if __name__ == "__main__":
    main()
