"""Multi-sequence exactness harness: one llama.cpp context, several KV sequences.

A Request is a fixed script: a prompt (prefilled in 128-token chunks at positions 0,128,...
with the invariant-rows switch off, logits on the prompt's last row), then generation ops:
("step",) one token with logits, or ("verify", k, keep) k tokens with logits for all, then
llama_memory_seq_rm(seq, pos+keep, -1) of the rejected tail. Tokens are drawn from the
request's own RNG, so the script does not depend on the logits.

run_alone: the request by itself in a fresh context (one decode per op, as LlamaBackend).
run_mixed: lanes (seq ids 0..n-1), each running a queue of requests; every round, each lane's
next generation op joins ONE llama_decode (rows ordered by seq id), prefill chunks in their own
decodes (prefill="separate") or in the same decode (prefill="mixed"). When a request ends its
sequence is cleared (seq_rm(seq,-1,-1)), leaving holes in a unified cache.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

import llama_cpp

LIB = llama_cpp.llama_cpp._lib
SET_INV = LIB.ggml_cpu_set_invariant_rows
SET_INV.argtypes, SET_INV.restype = [ctypes.c_int], None
EXACT_ROWS = 64
CHUNK = 128

_verbose = False
_log_lines: list[str] = []


@llama_cpp.llama_log_callback
def _log(level, text, user_data):
    s = text.decode("utf-8", errors="replace")
    _log_lines.append(s)
    if _verbose:
        sys.stderr.write(s)


llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def load_model(path):
    p = llama_cpp.llama_model_default_params()
    p.n_gpu_layers = 0
    m = llama_cpp.llama_model_load_from_file(str(path).encode(), p)
    assert m, path
    return m


def n_vocab_of(model):
    return int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))


# ---- counting graph computes (one per ubatch) with an eval callback --------------------
_get_name = LIB.ggml_get_name
_get_name.argtypes, _get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
GRAPH_COUNT = [0]


@llama_cpp.ggml_backend_sched_eval_callback
def _count_cb(t, ask, user_data):
    if _get_name(t) == b"result_output":
        if not ask:
            GRAPH_COUNT[0] += 1
        return True
    return False


class Ctx:
    def __init__(self, model, n_ctx, n_seq_max=1, unified=False, n_batch=512, threads=int(os.environ.get("MSEQ_THREADS", 2)),
                 flash=-1, count_graphs=False):
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = p.n_ubatch = n_batch
        p.n_seq_max = n_seq_max
        p.kv_unified = unified
        p.n_threads = p.n_threads_batch = threads
        p.no_perf = True
        p.flash_attn_type = flash
        if count_graphs:
            p.cb_eval = _count_cb
        _log_lines.clear()
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        assert self.ctx
        self.log = "".join(_log_lines)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = n_vocab_of(model)
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ctx))

    def decode(self, rows, switch):
        """rows: [(seq, pos, token, want_logits)] -> list of float32 arrays (rows wanting logits)"""
        SET_INV(switch)
        b = self.batch
        for i, (seq, pos, tok, want) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if want else 0
        b.n_tokens = len(rows)
        st = llama_cpp.llama_decode(self.ctx, b)
        if st != 0:
            raise RuntimeError(f"llama_decode status {st}")
        out = []
        for i, r in enumerate(rows):
            if r[3]:
                ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return out

    def rm(self, seq, p0, p1=-1):
        assert llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def close(self):
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


class Request:
    def __init__(self, name, seed, prompt_len, n_ops, vocab_lo, vocab_hi, kmax=8):
        self.name = name
        rng = np.random.default_rng(seed)
        self.prompt = [int(t) for t in rng.integers(vocab_lo, vocab_hi, prompt_len)]
        self.ops = []
        for _ in range(n_ops):
            if rng.random() < 0.35:
                toks = [int(rng.integers(vocab_lo, vocab_hi))]
                self.ops.append(("step", toks, 1))
            else:
                k = int(rng.integers(2, kmax + 1))
                toks = [int(t) for t in rng.integers(vocab_lo, vocab_hi, k)]
                keep = int(rng.integers(1, k + 1))
                self.ops.append(("verify", toks, keep))

    # a cursor over the script: yields "units" (prefill chunks, then gen ops)
    def units(self):
        L = len(self.prompt)
        bounds = [0, *range(CHUNK, L, CHUNK), L]
        for a, b in zip(bounds, bounds[1:]):
            yield ("prefill", a, self.prompt[a:b], b == L)
        pos = L
        for kind, toks, keep in self.ops:
            yield (kind, pos, toks, keep)
            pos += keep


def unit_rows(seq, unit):
    kind, pos, toks, extra = unit
    if kind == "prefill":
        last = extra
        return [(seq, pos + i, t, last and i == len(toks) - 1) for i, t in enumerate(toks)]
    return [(seq, pos + i, t, True) for i, t in enumerate(toks)]


def finish_unit(ctx, seq, unit):
    kind, pos, toks, extra = unit
    if kind == "verify" and extra < len(toks):
        ctx.rm(seq, pos + extra, -1)


def run_alone(ctx, req, seq=0):
    """The request alone, one decode per unit. Returns list of (label, logits[rows])."""
    ctx.rm(-1, -1, -1)
    rec = []
    for i, unit in enumerate(req.units()):
        rows = unit_rows(seq, unit)
        switch = 0 if unit[0] == "prefill" else EXACT_ROWS
        out = ctx.decode(rows, switch)
        if out:
            rec.append((f"{i}:{unit[0]}@{unit[1]}x{len(unit[2])}", np.stack(out)))
        finish_unit(ctx, seq, unit)
    ctx.rm(-1, -1, -1)
    return rec


def run_mixed(ctx, lanes, start_round=None, prefill="separate", switch=EXACT_ROWS, idle=None):
    """lanes: list (index = seq id) of lists of Requests run one after another.
    start_round[seq]: round at which the lane's first request starts. idle[seq]: rounds a lane
    waits between requests. Returns {request name: [(label, logits)]}."""
    ctx.rm(-1, -1, -1)
    n = len(lanes)
    start_round = start_round or [0] * n
    idle = idle or [1] * n
    queues = [list(l) for l in lanes]
    cursors = [None] * n  # (req, iterator, unit index)
    wait = list(start_round)
    rec = {r.name: [] for l in lanes for r in l}
    events = []
    rnd = 0
    while any(queues) or any(c is not None for c in cursors):
        pending = []  # (seq, req, unit, idx)
        for s in range(n):
            if cursors[s] is None:
                if wait[s] > 0:
                    wait[s] -= 1
                    continue
                if not queues[s]:
                    continue
                req = queues[s].pop(0)
                cursors[s] = [req, enumerate(req.units())]
            req, it = cursors[s]
            nxt = next(it, None)
            if nxt is None:
                ctx.rm(s, -1, -1)
                events.append((rnd, f"seq{s} cleared after {req.name}"))
                cursors[s] = None
                wait[s] = idle[s]
                continue
            idx, unit = nxt
            pending.append((s, req, unit, idx))
        if not pending:
            rnd += 1
            continue
        groups = []
        if prefill == "separate":
            for p in pending:
                if p[2][0] == "prefill":
                    groups.append(([p], 0))
            gen = [p for p in pending if p[2][0] != "prefill"]
            if gen:
                groups.append((gen, switch))
        else:
            groups.append((pending, switch))
        for group, sw in groups:
            rows, owners = [], []
            for s, req, unit, idx in group:
                r = unit_rows(s, unit)
                rows += r
                owners += [(req, unit, idx)] * sum(1 for x in r if x[3])
            out = ctx.decode(rows, sw)
            by_req = {}
            for (req, unit, idx), lg in zip(owners, out):
                by_req.setdefault((req.name, idx, unit[0], unit[1], len(unit[2])), []).append(lg)
            for (name, idx, kind, pos, ln), lgs in by_req.items():
                rec[name].append((f"{idx}:{kind}@{pos}x{ln}", np.stack(lgs)))
            for s, req, unit, idx in group:
                finish_unit(ctx, s, unit)
                if unit[0] == "verify" and unit[3] < len(unit[2]):
                    events.append((rnd, f"seq{s} rolled back {len(unit[2]) - unit[3]}"))
        rnd += 1
    ctx.rm(-1, -1, -1)
    return rec, events


def compare(ref, got):
    """First differing unit: None if bitwise identical everywhere."""
    if len(ref) != len(got):
        return f"length {len(ref)} vs {len(got)}"
    for (la, a), (lb, b) in zip(ref, got):
        assert la == lb, (la, lb)
        if not np.array_equal(a, b):
            rows = [i for i in range(len(a)) if not np.array_equal(a[i], b[i])]
            return f"first differs at unit {la} rows {rows} max|d|={np.max(np.abs(a - b)):.3g}"
    return None
