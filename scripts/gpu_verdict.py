"""Issue 40's targets, read off one GPU run's logs: what each measured, and whether it is met.

Usage: python scripts/gpu_verdict.py LOGDIR   (what scripts/gpu_device.sh wrote there)

It reads run.log (specdec's CUDA kernels' own tests and benches, the libraries' exports),
check.json (scripts/gpu_check.py; keys ending in ":exact+fattn_rows" are its exact mode with
patch 0006's attention kernel) and bench-*.json (`specdec bench --json`), and prints one line
per target: met, NOT MET, or missing (the run did not get that far). Exit status 0 only when
every target is measured and met; besides issue 40's, exact mode's logits must agree with
llama.cpp's kernels' (an invariant but wrong kernel passes the rest). Lines marked "info"
carry numbers without a target: patch 0006's attention kernel and greedy choices taken on the
GPU are two, opt-in until a GPU run has measured them.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Issue 40's targets ("What to build", items 3 to 5).
KERNEL_COLUMNS_RATIO = 1.1  # the kernel alone: 8 columns against 1 (its bench)
VERIFY_RATIO_7B = 1.3  # a 7B-shape verification of 8 rows against one step
SHAPE_CHANGE_RATIO = 1.1  # a decode in a run against its shape's steady cost
EXACT_ALONE_SPEEDUP = 0.97  # exact mode's target alone against llama.cpp's kernels
ORACLE_SPEEDUP = {"7b": 3.0, "1.5b": 2.0}
BENCH_PROMPTS = 6

KERNEL_TYPES = ("Q4_K", "Q6_K", "Q8_0")
# choice_costs.py's decodes: a target's step and verification, a drafter's step
CHOICE_LABELS = {"1": "1 row", "8": "8 rows", "step": "a drafter's step"}
KERNEL_BITS = "tensor-core kernel, every column the same bits alone and batched"


@dataclass
class Line:
    target: str
    measured: str
    met: bool | None  # None: not measured
    info: bool = False  # numbers without a target

    def render(self) -> str:
        mark = "info" if self.info else {True: "met", False: "NOT MET", None: "missing"}[self.met]
        return f"{mark:8} {self.target}: {self.measured}"


def kernel_test(log: str) -> Iterator[Line]:
    """The kernel's own test on the GPU: every type, every warp count, the same bits."""
    found = re.findall(r"^(Q4_K|Q6_K|Q8_0), (\d+) warps: (ok|FAILED)", log, re.MULTILINE)
    if not found:
        yield Line(KERNEL_BITS, "not run", None)
        return
    failed = [f"{t} {w} warps" for t, w, verdict in found if verdict != "ok"]
    own_warps = found[0][1]  # the test checks the kernel's own count (SPECDEC_MMV_WARPS) first
    types = {t for t, w, _ in found if w == own_warps}
    met = not failed and types == set(KERNEL_TYPES)
    measured = f"{len(found) - len(failed)}/{len(found)} ok" + (
        f", failed: {', '.join(failed)}" if failed else ""
    )
    yield Line(KERNEL_BITS, measured, met)


@dataclass
class BenchRow:
    matrix: str
    warps: int
    floor_us: float
    us_by_columns: dict[int, float]


BENCH_COLUMNS = (1, 2, 4, 8, 9, 16)
BENCH_ROW = re.compile(r"^(.+?)\s+(\d+)\s+([\d.]+)((?:\s+[\d.]+){6})\s+([\d.]+)x\s+(\d+)\s*$")


def kernel_bench_rows(log: str) -> list[BenchRow]:
    rows = []
    for line in log.splitlines():
        if match := BENCH_ROW.match(line):
            times = [float(v) for v in match.group(4).split()]
            rows.append(
                BenchRow(
                    match.group(1).strip(),
                    int(match.group(2)),
                    float(match.group(3)),
                    dict(zip(BENCH_COLUMNS, times, strict=True)),
                )
            )
    return rows


def kernel_bench(log: str) -> Iterator[Line]:
    """8 columns within KERNEL_COLUMNS_RATIO of one, with the kernel's own warps (the bench
    times them first); per warp count, how far n=1 is from reading the weights once."""
    rows = kernel_bench_rows(log)
    own = [r for r in rows if r.warps == rows[0].warps] if rows else []
    target = f"tensor-core kernel, 8 columns within {KERNEL_COLUMNS_RATIO}x of one"
    if not own:
        yield Line(target, "not run", None)
        return
    ratios = {r.matrix: r.us_by_columns[8] / r.us_by_columns[1] for r in own}
    worst = max(ratios, key=lambda k: ratios[k])
    yield Line(
        target, f"worst {ratios[worst]:.2f}x ({worst})", ratios[worst] <= KERNEL_COLUMNS_RATIO
    )
    for warps in sorted({r.warps for r in rows}):
        of_warps = [r for r in rows if r.warps == warps]
        floors = " ".join(f"{r.matrix}: {r.us_by_columns[1] / r.floor_us:.2f}" for r in of_warps)
        yield Line(f"n=1 against reading the weights once, {warps} warps", floors, None, info=True)


FATTN_ROWS = "exact mode's attention kernel (patch 0006)"
FATTN_BENCH_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)((?:\s+[\d.]+){5})\s+([\d.]+)x\s*$")


def attention_kernel(log: str) -> Iterator[Line]:
    """test_fattn_rows on the GPU: every pair the same bits in every batch, and its cost at
    8 rows against 1 by context (the floor: reading one layer's keys and values once)."""
    found = re.findall(
        r"^(d=\d+[^:]*): (FAILED|every pair the same bits in every batch)", log, re.M
    )
    if not found:
        yield Line(f"{FATTN_ROWS}: its own test", "not run", None, info=True)
        return
    failed = [name for name, verdict in found if verdict == "FAILED"]
    measured = f"{len(found) - len(failed)}/{len(found)} shapes ok" + (
        f", FAILED: {'; '.join(failed)}" if failed else ""
    )
    yield Line(f"{FATTN_ROWS}: its own test", measured, None, info=True)
    for line in log.splitlines():
        if match := FATTN_BENCH_ROW.match(line):
            model, context, floor = match.group(1), match.group(2), float(match.group(4))
            n1, n8 = (float(v) for v in match.group(5).split()[0:4:3])
            yield Line(
                f"{FATTN_ROWS}: {model} layer at {context} tokens",
                f"n=1 {n1:.1f} us, n=8 {n8:.1f} us ({n8 / n1:.2f}x), floor {floor:.1f} us",
                None,
                info=True,
            )


def exact_products(log: str) -> Iterator[Line]:
    """Which kernels the checks and benches gave exact mode's Q4_K, Q6_K and Q8_0 products
    (gpu_device.sh leaves the tensor-core kernel out where its own test failed, or where it
    failed in a model); and whether it worked in a model (patch 0004's hook)."""
    found = re.findall(r"^exact products: SPECDEC_CUDA_MMV_TC=(\d)", log, re.MULTILINE)
    measured = "not recorded"
    if found:  # the last: where the kernel failed in a model, the rest ran without it
        measured = "specdec's tensor-core kernel" if found[-1] == "1" else "patch 0003's MMVQ"
    yield Line("exact mode's quantised products in the checks and benches", measured, None, True)
    if re.search(r"^\[\d+s\] tensor-core kernel in a model$", log, re.MULTILINE):
        failed = "TENSOR-CORE KERNEL FAILED IN A MODEL" in log
        measured = "failed: the rest ran without it" if failed else "rows identical, logits agree"
        yield Line("tensor-core kernel in a model (patch 0004's hook)", measured, not failed)


def bench_choices(log: str) -> Iterator[Line]:
    """Where the benches took their greedy choices: gpu_device.sh gives them the GPU's where
    scripts/choice_costs.py found those paying (the same choices, no decode dearer)."""
    pattern = r"^benches' greedy choices: SPECDEC_DEVICE_CHOICES=(\S+) \((.*)\)$"
    found = re.findall(pattern, log, re.MULTILINE)
    if found:
        switch, why = found[-1]
        where = {"1": "on the GPU", "0": "on the host"}.get(
            switch, "as device_choices.CHOICES_ON_DEVICE says (on the host for CUDA)"
        )
        yield Line("greedy choices in the benches", f"{where}: {why}", None, True)


def library_exports(log: str) -> Iterator[Line]:
    counts = [int(n) for n in re.findall(r"exports libstdc\+\+ code: (\d+)", log)]
    measured = f"{sum(counts)} functions in {len(counts)} libraries" if counts else "not run"
    yield Line(
        "no library exports libstdc++'s code", measured, (sum(counts) == 0) if counts else None
    )


def model_checks(check: dict) -> Iterator[Line]:
    """gpu_check.py's results: invariance, verification's cost, exact against fast at n=1, and
    every decode of a run (plain and padded) against its shape's steady cost."""
    exact = {key.split(":")[0]: found for key, found in check.items() if key.endswith(":exact")}
    if not exact:
        yield Line("gpu_check.py: every exact row identical, n = 2..32", "not run", None)
        return
    for model, found in exact.items():
        differing = differing_sizes(found)
        measured = (
            "all identical" if not differing else f"rows differ at n = {', '.join(differing)}"
        )
        yield Line(f"{model}: every exact row identical, n = 2..32", measured, not differing)
    for model, found in exact.items():
        yield agreement(model, found)
    for model, found in exact.items():
        if "7b" in model:
            steady = found["steady_ms"]
            ratio = steady["8"] / steady["1"]
            yield Line(
                f"{model}: verifying 8 rows within {VERIFY_RATIO_7B}x of a step",
                f"{ratio:.2f}x",
                ratio <= VERIFY_RATIO_7B,
            )
    for model, found in exact.items():
        fast = check.get(f"{model}:fast")
        if fast:
            ratio = found["steady_ms"]["1"] / fast["steady_ms"]["1"]
            yield Line(f"{model}: exact step against fast", f"{ratio:.3f}x", None, info=True)
            yield from prompt_passes(model, found, fast)
        yield from shape_changes(model, found)
        yield from long_context(model, found, fast)
    yield from attention_in_models(check, exact)
    yield from device_choices(check)


def device_choices(check: dict) -> Iterator[Line]:
    """scripts/choice_costs.py: greedy choices taken on the GPU against the host's argmax of
    the rows sent back, by rows (what device_choices.CHOICES_ON_DEVICE should say for CUDA)."""
    for key, found in check.items():
        if not key.endswith(":choices"):
            continue
        host, device = found["host_ms"], found["device_ms"]
        measured = ", ".join(
            f"{CHOICE_LABELS.get(key, key)} {host[key]:.3f} -> {device[key]:.3f} ms "
            f"({device[key] / host[key]:.2f}x)"
            for key in host
        )
        measured += "" if found["same_choices"] else "; OTHER CHOICES THAN THE HOST'S"
        yield Line(f"{key.split(':')[0]}: greedy choices on the device", measured, None, True)


def differing_sizes(found: dict) -> list[str]:
    """The batch sizes whose exact rows differed, at 128 tokens of context and at the long
    context (marked "long") where gpu_check.py measured it."""
    checks = [("", found["invariance"])]
    if "long_context" in found:
        checks.append((" long", found["long_context"]["invariance"]))
    return [
        f"{n}{where}"
        for where, invariance in checks
        for n, r in invariance.items()
        if r["rows_identical"] != int(n)
    ]


AGREEMENT = "exact logits agree with llama.cpp's kernels"


def agreement(model: str, exact: dict) -> Line:
    """gpu_check.py's rows decoded alone, exact mode's against fast mode's: the least
    correlation of a row's logits at each context, against the least it allows there (0.9, or
    less where llama.cpp's own batch of those rows parts further from its rows alone: what
    summation orders alone move, with random weights, on this GPU)."""
    found = exact.get("agrees_with_fast")
    if not found:
        return Line(f"{model}: {AGREEMENT}", "not measured", None)
    measured = ", ".join(
        f"{where} {r['min_correlation']:.4f} (at least {r['least_allowed']:.4f}; llama.cpp's "
        f"batch against its rows alone {r['own_correlation']:.4f})"
        for where, r in found.items()
    )
    met = all(r["min_correlation"] >= r["least_allowed"] for r in found.values())
    return Line(f"{model}: {AGREEMENT}, least correlation", measured, met)


def verify_against_step(long: dict) -> str:
    step, verify = long["steady_ms"]["1"], long["steady_ms"]["8"]
    return f"step {step:.2f} ms, verify(8) {verify:.2f} ms ({verify / step:.2f}x)"


def long_context(model: str, exact: dict, fast: dict | None) -> Iterator[Line]:
    """A verification against a step at the long context, exact and fast: what attention adds
    to a verification beyond a step there."""
    if "long_context" not in exact:
        return
    long = exact["long_context"]
    measured = "exact " + verify_against_step(long)
    if fast and "long_context" in fast:
        measured += "; fast " + verify_against_step(fast["long_context"])
    yield Line(f"{model}: at {long['context']} tokens of context", measured, None, info=True)


def attention_in_models(check: dict, exact: dict) -> Iterator[Line]:
    """gpu_check.py --exact with SPECDEC_CUDA_FATTN_ROWS=1 against patch 0003's exact mode."""
    for key, found in check.items():
        if not key.endswith(":exact+fattn_rows"):
            continue
        model = key.split(":")[0]
        differing = differing_sizes(found)
        measured = (
            "rows identical" if not differing else f"rows differ at n = {', '.join(differing)}"
        )
        if "long_context" in found:
            measured += "; " + verify_against_step(found["long_context"])
            vector = exact.get(model, {}).get("long_context")
            if vector:
                measured += " (vector kernel: " + verify_against_step(vector) + ")"
        against = agreement(model, found)
        if against.met is not None:
            verdict = "" if against.met else ", PARTS FROM THEM"
            measured += f"; against llama.cpp's kernels: {against.measured}{verdict}"
        yield Line(f"{model}: {FATTN_ROWS}", measured, None, info=True)


def prompt_passes(model: str, exact: dict, fast: dict) -> Iterator[Line]:
    """A long prompt's first pass, exact (cut into PROMPT_CHUNKs) against llama.cpp's: what
    exact mode's fixed chunks cost a long prompt's first token on this GPU."""
    if "prompt_ms" in exact and "prompt_ms" in fast:
        tokens, ms = next(iter(exact["prompt_ms"].items()))
        fast_ms = fast["prompt_ms"][tokens]
        measured = f"{ms:.1f} ms against {fast_ms:.1f} ms, {ms / fast_ms:.2f}x"
        yield Line(f"{model}: a {tokens}-token prompt's pass, exact", measured, None, info=True)


def shape_changes(model: str, found: dict) -> Iterator[Line]:
    """gpu_check.py's ratios of each decode in a run to its shape's steady cost. Either way of
    running meets the target: plain verifications, or verifications padded to one width (then
    exactness.VERIFY_PADDING should pad on this backend)."""
    worst = {}
    for key in ("run", "padded_run"):
        if (ratios := found.get(f"{key}_against_steady")) is not None:
            n = max(ratios, key=lambda k: ratios[k])
            worst[key] = (ratios[n], n)
    if not worst:
        return
    measured = "; ".join(
        f"{key}: worst {r:.2f}x (n={n}){graphs_reused(found, key)}" for key, (r, n) in worst.items()
    )
    met = [key for key, (r, _) in worst.items() if r <= SHAPE_CHANGE_RATIO]
    if met == ["padded_run"]:
        measured += ": met padded only, pad verifications on this backend"
    yield Line(
        f"{model}: a run's decodes within {SHAPE_CHANGE_RATIO}x of steady, plain or padded",
        measured,
        bool(met),
    )


def graphs_reused(found: dict, key: str) -> str:
    """How many of a run's decodes reused their shape's graph (patch 0005), where measured."""
    reused = found.get(f"{key}_graphs_reused")
    return f", graphs reused {reused}" if reused else ""


def suite_rows(bench: dict) -> dict[str, dict]:
    return {
        r["configuration"]: r for r in bench["summary"]["configurations"] if r["name"] == "suite"
    }


def bench_lines(tag: str, bench: dict | None) -> Iterator[Line]:
    """`specdec bench`: the oracle's ceiling with identical answers, and exact mode's target
    alone against llama.cpp's kernels; the other drafters' rows as information (with random
    weights a model drafter's drafts are noise: the planner must keep the target's pace)."""
    oracle_target = ORACLE_SPEEDUP.get(tag)
    label = f"bench {tag}: oracle" + (
        f" >= {oracle_target}x, {BENCH_PROMPTS}/{BENCH_PROMPTS} identical" if oracle_target else ""
    )
    if bench is None:
        yield Line(label, "not run", None, info=oracle_target is None)
        return
    rows = suite_rows(bench)
    oracle = rows.get("oracle")
    if oracle is None:
        yield Line(label, "no oracle row", None)
    else:
        speedup = oracle["speedup"]["median"]
        measured = speedup_and_identity(oracle)
        if oracle_target is None:
            yield Line(label, measured, None, info=True)
        else:
            all_identical = (
                oracle["identical_prompts"] == oracle["compared_prompts"] == BENCH_PROMPTS
            )
            yield Line(label, measured, speedup >= oracle_target and all_identical)
        yield from host_shares(tag, oracle)
    yield from drafter_costs(tag, bench.get("decode_costs"))
    alone = rows.get("target alone, exact")
    if alone is not None and oracle_target:
        speedup = alone["speedup"]["median"]
        yield Line(
            f"bench {tag}: exact alone >= {EXACT_ALONE_SPEEDUP}x of fast",
            f"{speedup:.3f}x",
            speedup >= EXACT_ALONE_SPEEDUP,
        )
    judged = ("oracle", "target alone, exact") if oracle_target else ("oracle",)
    for label, row in rows.items():
        if label not in judged:
            yield Line(f"bench {tag}: {label}", speedup_and_identity(row), None, info=True)


def host_shares(tag: str, row: dict) -> Iterator[Line]:
    """Each side's share of its time outside the models' decodes, where the bench reports it:
    what specdec's own work per pass costs on this machine's host, against a GPU's step."""
    sides = ("target_alone", "speculative")
    alone, oracle = (row.get(side, {}).get("host_share") for side in sides)
    if alone is not None and oracle is not None:
        measured = f"target alone {alone:.1%}, oracle {oracle:.1%}"
        yield Line(f"bench {tag}: time outside the decodes", measured, None, info=True)


def drafter_costs(tag: str, costs: dict | None) -> Iterator[Line]:
    """The drafter's step and the price of its catch-up as the bench's runs left them: what
    the planner weighs a model draft with on this GPU (docs/gpus.md, "The planner on a GPU")."""
    now = (costs or {}).get("now", {})
    if now.get("draft_step_ms") and now.get("catch_up"):
        price = now["catch_up"]
        measured = (
            f"step {now['draft_step_ms']:.2f} ms; catch-up {price['fixed_ms']:.2f} ms "
            f"+ {price['token_ms']:.4f} ms a token"
        )
        yield Line(f"bench {tag}: drafter", measured, None, info=True)


def speedup_and_identity(row: dict) -> str:
    identical = f"{row['identical_prompts']}/{row['compared_prompts']}"
    return f"{row['speedup']['median']:.2f}x, identical {identical}"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def verdict(log_dir: Path) -> list[Line]:
    log = (
        (log_dir / "run.log").read_text(errors="replace") if (log_dir / "run.log").exists() else ""
    )
    lines: list[Line] = [*kernel_test(log), *kernel_bench(log), *exact_products(log)]
    lines += attention_kernel(log)
    lines += bench_choices(log)
    lines += library_exports(log)
    lines += model_checks(read_json(log_dir / "check.json") or {})
    for tag in ("7b", "1.5b", "7b-padded"):
        lines += bench_lines(tag, read_json(log_dir / f"bench-{tag}.json"))
    return lines


def main() -> int:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print(
            "usage: python scripts/gpu_verdict.py LOGDIR (the folder scripts/gpu_device.sh wrote)",
            file=sys.stderr,
        )
        return 2
    lines = verdict(Path(sys.argv[1]))
    for line in lines:
        print(line.render())
    return 0 if all(line.met for line in lines if not line.info) else 1


if __name__ == "__main__":
    sys.exit(main())
