"""Cost of one decode with the invariant-rows switch at 64: rows of one sequence vs rows of
several sequences, in kv_unified false/true contexts (n_seq_max 4, each sequence with a
PROMPT-token prompt), plus a single-sequence context (as LlamaBackend opens it). Median of REPS
interleaved runs; every decode's rows are removed again (seq_rm) so the state is constant.
Also counts graph computes (ubatches) per decode with an eval callback (separate contexts).
usage: cost.py MODEL [REPS] [PROMPT] [THREADS=1]  (2 threads on this shared 2-core machine spin in
OpenMP barriers: 3.2 s vs 0.15 s a token; ratios are measured with 1)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

model = H.load_model(sys.argv[1])
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 12
PROMPT = int(sys.argv[3]) if len(sys.argv) > 3 else 128
THREADS = int(sys.argv[4]) if len(sys.argv) > 4 else 1
nv = H.n_vocab_of(model)
lo, hi = (259, nv - 2) if nv < 5000 else (200, 60000)
rng = np.random.default_rng(3)
prompts = [[int(t) for t in rng.integers(lo, hi, PROMPT)] for _ in range(4)]
tok = [int(t) for t in rng.integers(lo, hi, 64)]

SHAPES = {  # name: rows per sequence (index = seq id)
    "1x1 (1 row, seq 0)": [1],
    "1x4 (4 rows, seq 0)": [4],
    "4x1 (1 row each of 4 seqs)": [1, 1, 1, 1],
    "1x16 (16 rows, seq 0)": [16],
    "4x4 (4 rows each of 4 seqs)": [4, 4, 4, 4],
    "uneven 1,4,2,3": [1, 4, 2, 3],
    "seqs 0,2 only (1 row each)": [1, 0, 1, 0],
}


def rows_of(shape):
    rows = []
    for s, n in enumerate(shape):
        rows += [(s, PROMPT + i, tok[(7 * s + i) % 64], True) for i in range(n)]
    return rows


def setup(ctx, nseq):
    ctx.rm(-1, -1, -1)
    for s in range(nseq):
        ctx.decode([(s, i, t, False) for i, t in enumerate(prompts[s])], 0)


def run(ctx, shape):
    rows = rows_of(shape)
    t = time.perf_counter()
    ctx.decode(rows, 64)
    dt = time.perf_counter() - t
    for s, n in enumerate(shape):
        if n:
            ctx.rm(s, PROMPT, -1)
    return dt


ctxs = {
    "single-seq ctx (n_seq_max=1)": H.Ctx(model, 1024, 1, False, threads=THREADS),
    "kv_unified=false (n_seq_max=4)": H.Ctx(model, 4096, 4, False, threads=THREADS),
    "kv_unified=true  (n_seq_max=4)": H.Ctx(model, 4096, 4, True, threads=THREADS),
}
for name, c in ctxs.items():
    setup(c, 1 if "single" in name else 4)

# graph computes per decode
counts = {}
for name, (nsm, uni) in {"kv_unified=false (n_seq_max=4)": (4, False),
                         "kv_unified=true  (n_seq_max=4)": (4, True)}.items():
    c = H.Ctx(model, 4096, nsm, uni, threads=THREADS, count_graphs=True)
    setup(c, 4)
    for sh_name, sh in SHAPES.items():
        H.GRAPH_COUNT[0] = 0
        run(c, sh)
        counts[(name, sh_name)] = H.GRAPH_COUNT[0]
    c.close()

times = {}
for rep in range(REPS + 1):
    for sh_name, sh in SHAPES.items():
        for name, c in ctxs.items():
            if "single" in name and len([n for n in sh if n]) > 1:
                continue
            if "single" in name and sh[0] == 0:
                continue
            dt = run(c, sh)
            if rep:  # first round is warm-up
                times.setdefault((name, sh_name), []).append(dt)

base = statistics.median(times[("single-seq ctx (n_seq_max=1)", "1x1 (1 row, seq 0)")])
print(f"PROMPT={PROMPT} REPS={REPS} THREADS={THREADS}; ratios to one row in the single-sequence context "
      f"(= {base * 1e3:.1f} ms here, 2 shared cores)")
for sh_name in SHAPES:
    for name in ctxs:
        if (name, sh_name) not in times:
            continue
        med = statistics.median(times[(name, sh_name)])
        n = counts.get((name, sh_name), 1)
        print(f"  {sh_name:28s} {name:32s} x{med / base:5.2f}  graph computes={n}")
for c in ctxs.values():
    c.close()
