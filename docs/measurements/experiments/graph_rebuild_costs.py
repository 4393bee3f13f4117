"""What llama.cpp's graph rebuild costs on the host, for one model on this machine: one-token
decodes in two contexts of the model, one reusing its graph and one rebuilding it at every
decode (LLAMA_GRAPH_REUSE_DISABLE, read when a context is made), interleaved; medians.

    .venv/bin/python docs/measurements/experiments/graph_rebuild_costs.py MODEL.gguf

A change of batch shape (a drafter's step after its catch-up, a verification of another
width) pays that rebuild; on a GPU it is most of what alternating shapes cost beyond their
steady cost (docs/gpus.md, "Alternating shapes").
"""

import ctypes
import os
import statistics
import sys
import time

import llama_cpp as L

DECODES = 300
CONTEXT_TOKENS = 100


def context(model, environment: dict[str, str]):
    """A context of `model`, made with `environment` set (llama.cpp reads it then)."""
    os.environ.update(environment)
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 1024, 512, 512
    params.n_threads = params.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, params)
    return ctx, L.llama_get_memory(ctx), L.llama_batch_init(512, 0, 1)


def decode(context_, tokens, first_position):
    ctx, _, batch = context_
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i] = token, first_position + i
        batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, 1
    assert L.llama_decode(ctx, batch) == 0


def timed_step(context_) -> float:
    L.llama_memory_seq_rm(context_[1], 0, CONTEXT_TOKENS, -1)
    start = time.perf_counter()
    decode(context_, [300], CONTEXT_TOKENS)
    return time.perf_counter() - start


def main() -> None:
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
    reused = context(model, {"LLAMA_GRAPH_REUSE_DISABLE": "0"})
    rebuilt = context(model, {"LLAMA_GRAPH_REUSE_DISABLE": "1"})
    prompt = [(i * 7919) % 20000 + 100 for i in range(CONTEXT_TOKENS)]
    for context_ in (reused, rebuilt):
        decode(context_, prompt, 0)
    times: dict[str, list[float]] = {"reused": [], "rebuilt": []}
    for _ in range(DECODES):
        times["reused"].append(timed_step(reused))
        times["rebuilt"].append(timed_step(rebuilt))
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    print(
        f"{os.path.basename(sys.argv[1])}: one-token decode, graph reused {ms['reused']:.3f} ms,"
        f" rebuilt {ms['rebuilt']:.3f} ms: the rebuild {ms['rebuilt'] - ms['reused']:.3f} ms"
    )


if __name__ == "__main__":
    main()
