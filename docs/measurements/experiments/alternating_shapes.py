"""What patch 0005's graphs per shape save when decode shapes alternate, for one model on this
machine: n=8 then n=1 after the same context, as a target's verifications and steps come, in
two contexts of the model, one with llama.cpp's single graph (SPECDEC_GRAPH_SLOTS=0, read
when a context is made) and one with the patch's slots; interleaved, medians. It also counts
the graphs each context reused and compares every decode's logits between the two, bit for bit.
Every layer goes where llama.cpp puts it by default: on the GPU, where the build has one
(scripts/gpu_device.sh runs it there).

    .venv/bin/python docs/measurements/experiments/alternating_shapes.py MODEL.gguf [ROUNDS]
"""

import ctypes
import os
import statistics
import sys
import time

import llama_cpp as L
import numpy as np
from graph_rebuild_costs import context, decode  # beside this script

CONTEXT_TOKENS = 100
WIDTHS = (8, 1)


def timed_decode(context_, tokens, n_vocab):
    L.llama_memory_seq_rm(context_[1], 0, CONTEXT_TOKENS, -1)
    start = time.perf_counter()
    decode(context_, tokens, CONTEXT_TOKENS)
    seconds = time.perf_counter() - start
    logits = np.ctypeslib.as_array(L.llama_get_logits(context_[0]), shape=(len(tokens), n_vocab))
    return seconds, logits.copy()


def main() -> None:
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    contexts = {
        "one graph": context(model, {"SPECDEC_GRAPH_SLOTS": "0"}),
        "slots": context(model, {"SPECDEC_GRAPH_SLOTS": "8"}),
    }
    prompt = [(i * 7919) % 20000 + 100 for i in range(CONTEXT_TOKENS)]
    for context_ in contexts.values():
        decode(context_, prompt, 0)
    times = {(name, n): [] for name in contexts for n in WIDTHS}
    differing = 0
    for round_ in range(rounds):
        for n in WIDTHS:
            tokens = [(round_ * 31 + j * 17) % 20000 + 100 for j in range(n)]
            results = {name: timed_decode(c, tokens, n_vocab) for name, c in contexts.items()}
            differing += not np.array_equal(results["one graph"][1], results["slots"][1])
            for name, (seconds, _) in results.items():
                times[(name, n)].append(seconds)
    decodes = rounds * len(WIDTHS)
    for name, context_ in contexts.items():
        reused = L.llama_perf_context(context_[0]).n_reused
        ms = " ".join(f"n={n} {statistics.median(times[(name, n)]) * 1e3:.3f} ms" for n in WIDTHS)
        print(f"{os.path.basename(sys.argv[1])}, {name}: {ms}, graphs reused {reused} of {decodes}")
    print(f"decodes whose logits differ between the two: {differing} of {decodes}")


if __name__ == "__main__":
    main()
