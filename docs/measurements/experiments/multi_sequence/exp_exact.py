"""Is a sequence's logits bitwise the same alone and batched with other sequences' rows?

usage: exp_exact.py MODEL [--scale small|big] [--backend]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
import time

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--scale", default="small")
ap.add_argument("--backend", action="store_true", help="also compare with LlamaBackend(exact=True)")
ap.add_argument("--prefill", default="separate,mixed")
ap.add_argument("--unified", default="0,1")
args = ap.parse_args()

model = H.load_model(args.model)
nv = H.n_vocab_of(model)
lo, hi = (259, nv - 2) if nv < 5000 else (200, 60000)

if args.scale == "small":
    P0, OPS0 = 300, 30
    others = {
        1: [(60, 6), (200, 10), (40, 8)],
        2: [(150, 12), (90, 5), (130, 9)],
        3: [(20, 4), (260, 14)],
    }
else:  # real model: fewer tokens
    P0, OPS0 = 260, 18
    others = {
        1: [(40, 4), (150, 6)],
        2: [(130, 7), (30, 4)],
        3: [(10, 3), (140, 6)],
    }

req0 = H.Request("r0", 1000, P0, OPS0, lo, hi)
lanes = [[req0]]
for s, specs in others.items():
    lanes.append([H.Request(f"r{s}.{j}", 10 * s + j, pl, no, lo, hi) for j, (pl, no) in enumerate(specs)])
start_round = [4, 0, 1, 2]  # lane 0 starts after others have cells (and holes)
N_CTX_SEQ = 1024

t0 = time.time()
# references: each request alone
refs_1 = {}
c1 = H.Ctx(model, N_CTX_SEQ, 1, False)
print("n_seq_max=1 context: n_ctx", c1.n_ctx, "flash_attn log:",
      [l.strip() for l in c1.log.splitlines() if "Flash Attention" in l or "flash_attn" in l][:3])
for l in lanes:
    for r in l:
        refs_1[r.name] = H.run_alone(c1, r)
c1.close()
print(f"alone refs (n_seq_max=1) done in {time.time() - t0:.1f}s", flush=True)

if args.backend:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import numpy as np
    from specdec_cli.llama.backend import LlamaBackend

    be = LlamaBackend(args.model, n_ctx=N_CTX_SEQ, exact=True, n_threads=2)
    rec = []
    out = be.decode(req0.prompt, 1, prompt=True)
    rec.append(np.array(out))
    pos = len(req0.prompt)
    for kind, toks, keep in req0.ops:
        rec.append(np.array(be.decode(toks, len(toks))))
        be.truncate(pos + keep)
        pos += keep
    be.close()
    mine = [a for _, a in refs_1["r0"]]
    same = len(mine) == len(rec) and all(np.array_equal(a, b) for a, b in zip(mine, rec))
    bad = [i for i, (a, b) in enumerate(zip(mine, rec)) if not np.array_equal(a, b)]
    print(f"LlamaBackend(exact=True) vs harness alone (n_seq_max=1): identical={same} "
          f"first differing unit={bad[:1]}", flush=True)

for unified in [bool(int(u)) for u in args.unified.split(",")]:
    n_ctx = N_CTX_SEQ * 4
    ca = H.Ctx(model, n_ctx, 4, unified)
    print(f"\n=== kv_unified={unified}: n_ctx={ca.n_ctx} n_ctx_seq={ca.n_ctx_seq}")
    # alone in the same configuration (seq 0 of an n_seq_max=4 context)
    for name in ["r0"]:
        r = req0
        d = H.compare(refs_1["r0"], H.run_alone(ca, r, seq=0))
        print(f"  alone in n_seq_max=4 ctx (seq 0) vs n_seq_max=1 ctx: {d or 'IDENTICAL'}")
        d = H.compare(refs_1["r0"], H.run_alone(ca, r, seq=2))
        print(f"  alone in n_seq_max=4 ctx (seq 2) vs n_seq_max=1 ctx: {d or 'IDENTICAL'}")
    for prefill in args.prefill.split(","):
        t1 = time.time()
        rec, events = H.run_mixed(ca, lanes, start_round=start_round, prefill=prefill)
        n_bad = 0
        for l in lanes:
            for r in l:
                d = H.compare(refs_1[r.name], rec[r.name])
                if d:
                    n_bad += 1
                print(f"  prefill={prefill:8s} {r.name:6s}: {d or 'IDENTICAL'}")
        print(f"  prefill={prefill}: {n_bad} requests differ ({time.time() - t1:.1f}s); "
              f"{sum('rolled' in e for _, e in events)} rollbacks, "
              f"{sum('cleared' in e for _, e in events)} clears", flush=True)
    ca.close()
