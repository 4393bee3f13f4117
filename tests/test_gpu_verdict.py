"""scripts/gpu_verdict.py reads a GPU run's logs against issue 40's targets: a run that met
them passes, and each way of missing one (or of not getting that far) fails, naming it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from project_scripts import load_script

MODELS = ("qwen2.5-7b.gguf", "qwen2.5-1.5b.gguf")


@pytest.fixture(scope="module")
def gpu_verdict():
    return load_script("gpu_verdict")


def bench_row(matrix: str, warps: int, floor: float, us: list[float]) -> str:
    """A row as test_mmv_tc.cu's bench prints it ("%-20s %5d %8.1f", " %9.1f" per column count,
    " %8.2fx %9.0f")."""
    columns = "".join(f" {t:9.1f}" for t in us)
    return f"{matrix:<20} {warps:5d} {floor:8.1f}{columns} {us[3] / us[0]:8.2f}x {1e4 / us[0]:9.0f}"


ATTENTION_OK = "every pair the same bits in every batch"


def attention_log(verdict: str) -> list[str]:
    """test_fattn_rows's lines as it prints them: a verdict per shape, then its bench rows
    ("%-6s %7d %5d %8.1f", " %8.1f" per row count, " %7.2fx")."""
    verdicts = [
        f"d=64, 14 heads, 2 KV heads, 3 parts: {verdict} (double precision: 2.15e-06)",
        f"d=128, 12 heads, 2 KV heads, 2 parts: {ATTENTION_OK} (double precision: 2.61e-06)",
    ]
    bench = [
        "NVIDIA H200; us per layer's attention of n rows, and the floor: reading its keys and"
        " values once",
        f"{'7B':<6} {4096:7d} {32:5d} {9.5:8.1f}"
        + "".join(f" {t:8.1f}" for t in (12.0, 12.5, 13.0, 15.0, 19.0))
        + f" {15.0 / 12.0:7.2f}x",
    ]
    return verdicts + bench


def run_log(
    kernel: str = "ok",
    n8: float = 12.5,
    exported: int = 0,
    tc: int = 1,
    attention: str = ATTENTION_OK,
    in_model: str = "ok",
    choices: str = "1 (choice_costs.py found they pay)",
) -> str:
    tests = [
        f"{t}, {w} warps: {kernel if t == 'Q6_K' else 'ok'} (double product: 1e-08)"
        for w in (8, 4, 16)
        for t in ("Q4_K", "Q6_K", "Q8_0")
    ]
    bench = [
        "NVIDIA H200; us per product of n columns, and the floor: reading the weights once",
        bench_row("7B ffn_up Q4_K", 8, 10.1, [12.0, 12.1, 12.3, n8, 20.0, 21.0]),
        bench_row("7B ffn_up Q4_K", 4, 10.1, [14.0, 14.1, 14.3, 14.5, 24.0, 25.0]),
        bench_row("1.5B ffn_down Q6_K", 8, 3.0, [4.0, 4.0, 4.1, 4.2, 7.0, 7.1]),
    ]
    exports = [
        f"lib{name}.so: needs libstdc++.so.6: 1, exports libstdc++ code: {count}"
        for name, count in (("ggml-cuda", exported), ("llama", 0))
    ]
    products = [f"exact products: SPECDEC_CUDA_MMV_TC={tc}"]
    if tc:
        products.append("[95s] tensor-core kernel in a model")
    if in_model == "FAILED":
        failed = "[97s] TENSOR-CORE KERNEL FAILED IN A MODEL: the checks and benches without it"
        products += [failed, "exact products: SPECDEC_CUDA_MMV_TC=0"]
    products.append(f"benches' greedy choices: SPECDEC_DEVICE_CHOICES={choices}")
    return "\n".join(tests + bench + products + attention_log(attention) + exports) + "\n"


def model_found(
    identical: int = 8,
    step: float = 3.8,
    verify: float = 4.5,
    plain: float = 1.02,
    padded: float = 1.02,
    long_identical: int = 8,
    long_verify: float = 7.6,
    correlation: float = 0.9987,
) -> dict:
    """gpu_check.py's findings for one model and mode; `plain`: a run's one-row decodes
    against a steady step; `padded`: a padded run's decodes against their shapes' steady costs
    (one row for a single token, 8 for the rest); `correlation`: the least of exact mode's
    rows against fast mode's at the long context."""
    invariance = {
        str(n): {"max_diff": 0.0, "rows_identical": n, "same_argmax": n, "min_correlation": 1.0}
        for n in (2, 4, 8, 16, 32)
    }
    invariance["8"]["rows_identical"] = identical
    steady = {"1": step, "2": step * 1.05, "8": verify}
    return {
        "invariance": invariance,
        "steady_ms": steady,
        "run_ms": {"1": step * plain, "2": steady["2"], "8": verify},
        "run_against_steady": {"1": plain, "2": 1.0, "8": 1.0},
        "padded_run_ms": {"1": step * padded, "2": verify * padded, "8": verify * padded},
        "padded_run_against_steady": {"1": padded, "2": padded, "8": padded},
        "prompt_ms": {"1024": 130.0},
        "long_context": {
            "context": 3000,
            "invariance": {
                str(n): {"max_diff": 0.0, "rows_identical": n, "same_argmax": n} for n in (2, 8)
            }
            | {"8": {"max_diff": 0.1, "rows_identical": long_identical, "same_argmax": 8}},
            "steady_ms": {"1": 4.0, "8": long_verify},
        },
        "agrees_with_fast": {
            where: {"min_correlation": r, "max_diff": 2.1, "logit_std": 4.4, "same_argmax": 7}
            | {"rows": 8, "own_correlation": own, "least_allowed": min(0.9, 3 * own - 2)}
            for where, r, own in (("short", 0.9991, 1.0), ("long", correlation, 0.95))
        },
    }


def check_json(**exact) -> dict:
    found = {}
    for model in MODELS:
        found[f"{model}:exact"] = model_found(**exact)
        found[f"{model}:fast"] = model_found(step=3.75, verify=8.3)
        found[f"{model}:fast"]["prompt_ms"] = {"1024": 100.0}
    found[f"{MODELS[0]}:exact+fattn_rows"] = model_found(long_verify=5.0)
    return found


def bench(oracle: float = 3.4, identical: int = 6, alone: float = 0.99) -> dict:
    def row(label: str, speedup: float, same: int) -> dict:
        return {
            "name": "suite",
            "configuration": label,
            "speedup": {"median": speedup},
            "identical_prompts": same,
            "compared_prompts": 6,
            "target_alone": {"host_share": 0.031},
            "speculative": {"host_share": 0.124},
        }

    rows = [
        row("target alone, exact", alone, 5),
        row("oracle", oracle, identical),
        row("model k=8", 0.95, 6),
    ]
    costs = {"draft_step_ms": 1.21, "catch_up": {"fixed_ms": 2.183, "token_ms": 0.0325}}
    return {"summary": {"configurations": rows}, "decode_costs": {"now": costs}}


def write_run(
    folder: Path, log: str | None = None, check: dict | None = None, benches: dict | None = None
) -> Path:
    (folder / "run.log").write_text(run_log() if log is None else log)
    (folder / "check.json").write_text(json.dumps(check_json() if check is None else check))
    benches = (
        {"7b": bench(), "1.5b": bench(oracle=2.4), "7b-padded": bench(oracle=3.9)}
        if benches is None
        else benches
    )
    for tag, found in benches.items():
        (folder / f"bench-{tag}.json").write_text(json.dumps(found))
    return folder


def verdict(gpu_verdict, folder: Path, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["gpu_verdict.py", str(folder)])
    code = gpu_verdict.main()
    return code, capsys.readouterr().out


def test_a_run_that_met_every_target_passes(gpu_verdict, tmp_path, monkeypatch, capsys):
    code, out = verdict(gpu_verdict, write_run(tmp_path), monkeypatch, capsys)
    assert code == 0, out
    assert "NOT MET" not in out and "missing" not in out
    assert "met      bench 7b: oracle >= 3.0x, 6/6 identical: 3.40x, identical 6/6" in out
    assert "info     bench 7b-padded: oracle: 3.90x" in out
    assert "info     bench 7b: time outside the decodes: target alone 3.1%, oracle 12.4%" in out
    prompt = "a 1024-token prompt's pass, exact: 130.0 ms against 100.0 ms, 1.30x"
    assert f"info     qwen2.5-7b.gguf: {prompt}" in out
    drafter = "step 1.21 ms; catch-up 2.18 ms + 0.0325 ms a token"
    assert f"info     bench 7b: drafter: {drafter}" in out
    assert "info     n=1 against reading the weights once, 4 warps: 7B ffn_up Q4_K: 1.39" in out
    products = "info     exact mode's quantised products in the checks and benches"
    assert f"{products}: specdec's tensor-core kernel" in out
    hook = "tensor-core kernel in a model (patch 0004's hook): rows identical, logits agree"
    assert f"met      {hook}" in out
    assert "info     bench 7b: model k=8: 0.95x, identical 6/6" in out
    assert "info     bench 7b-padded: target alone, exact: 0.99x, identical 5/6" in out
    long = "exact step 4.00 ms, verify(8) 7.60 ms (1.90x); fast step 4.00 ms, verify(8) 7.60 ms"
    assert f"info     qwen2.5-7b.gguf: at 3000 tokens of context: {long} (1.90x)" in out
    attention = "exact mode's attention kernel (patch 0006)"
    assert f"info     {attention}: its own test: 2/2 shapes ok" in out
    kernel_bench = "7B layer at 4096 tokens: n=1 12.0 us, n=8 15.0 us (1.25x), floor 9.5 us"
    assert f"info     {attention}: {kernel_bench}" in out
    in_model = "rows identical; step 4.00 ms, verify(8) 5.00 ms (1.25x) (vector kernel: step"
    assert f"info     qwen2.5-7b.gguf: {attention}: {in_model} 4.00 ms, verify(8) 7.60" in out
    agree = "exact logits agree with llama.cpp's kernels, least correlation"
    short = "short 0.9991 (at least 0.9000; llama.cpp's batch against its rows alone 1.0000)"
    long = "long 0.9987 (at least 0.8500; llama.cpp's batch against its rows alone 0.9500)"
    assert f"met      qwen2.5-7b.gguf: {agree}: {short}, {long}\n" in out
    kernels = f"against llama.cpp's kernels: {short}, {long}\n"
    assert f"{attention}: {in_model} 4.00 ms, verify(8) 7.60 ms (1.90x)); {kernels}" in out


def test_a_kernel_that_fails_in_a_model_fails_and_the_rest_ran_without_it(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    folder = write_run(tmp_path, log=run_log(in_model="FAILED"))
    code, out = verdict(gpu_verdict, folder, monkeypatch, capsys)
    assert code == 1
    hook = "tensor-core kernel in a model (patch 0004's hook): failed: the rest ran without it"
    assert f"NOT MET  {hook}" in out
    assert "quantised products in the checks and benches: patch 0003's MMVQ" in out


def test_patch_0006s_attention_kernel_is_information_not_a_target(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    """Opt-in until a GPU run measures it: its failures show, and fail nothing."""
    check = check_json()
    check["qwen2.5-7b.gguf:exact+fattn_rows"] = model_found(identical=7, correlation=0.02)
    folder = write_run(tmp_path, log=run_log(attention="FAILED"), check=check)
    code, out = verdict(gpu_verdict, folder, monkeypatch, capsys)
    assert code == 0, out
    attention = "exact mode's attention kernel (patch 0006)"
    failed = "1/2 shapes ok, FAILED: d=64, 14 heads, 2 KV heads, 3 parts"
    assert f"info     {attention}: its own test: {failed}" in out
    assert f"info     qwen2.5-7b.gguf: {attention}: rows differ at n = 8;" in out
    parted = "long 0.0200 (at least 0.8500; llama.cpp's batch against its rows alone 0.9500)"
    assert f"{parted}, PARTS FROM THEM" in out


def test_a_run_whose_kernel_test_failed_says_its_checks_ran_without_the_kernel(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    """gpu_device.sh measures patch 0003's kernels instead: the verdict says which ran."""
    code, out = verdict(
        gpu_verdict, write_run(tmp_path, log=run_log(kernel="FAILED", tc=0)), monkeypatch, capsys
    )
    assert code == 1
    assert "quantised products in the checks and benches: patch 0003's MMVQ" in out


@pytest.mark.parametrize(
    ("broken", "line"),
    [
        (
            {"log": run_log(kernel="FAILED")},
            "NOT MET  tensor-core kernel, every column the same bits alone and batched: 6/9 ok",
        ),
        (
            {"log": run_log(n8=14.0)},
            "NOT MET  tensor-core kernel, 8 columns within 1.1x of one: worst 1.17x",
        ),
        (
            {"log": run_log(exported=3)},
            "NOT MET  no library exports libstdc++'s code: 3 functions in 2 libraries",
        ),
        (
            {"check": check_json(identical=7)},
            "NOT MET  qwen2.5-7b.gguf: every exact row identical, n = 2..32: rows differ at n = 8",
        ),
        (
            {"check": check_json(long_identical=7)},
            "NOT MET  qwen2.5-7b.gguf: every exact row identical, n = 2..32: "
            "rows differ at n = 8 long",
        ),
        (
            {"check": check_json(correlation=0.41)},
            "NOT MET  qwen2.5-7b.gguf: exact logits agree with llama.cpp's kernels, least "
            "correlation: short 0.9991 (at least 0.9000; llama.cpp's batch against its rows "
            "alone 1.0000), long 0.4100",
        ),
        (
            {"check": check_json(verify=5.3)},
            "NOT MET  qwen2.5-7b.gguf: verifying 8 rows within 1.3x of a step: 1.39x",
        ),
        (
            {"check": check_json(plain=1.13, padded=1.12)},
            "NOT MET  qwen2.5-7b.gguf: a run's decodes within 1.1x of steady, plain or padded: "
            "run: worst 1.13x (n=1); padded_run: worst 1.12x (n=1)",
        ),
        (
            {"benches": {"7b": bench(identical=5), "1.5b": bench()}},
            "NOT MET  bench 7b: oracle >= 3.0x, 6/6 identical: 3.40x, identical 5/6",
        ),
        (
            {"benches": {"7b": bench(oracle=2.9), "1.5b": bench()}},
            "NOT MET  bench 7b: oracle >= 3.0x, 6/6 identical: 2.90x",
        ),
        (
            {"benches": {"7b": bench(), "1.5b": bench(alone=0.96)}},
            "NOT MET  bench 1.5b: exact alone >= 0.97x of fast: 0.960x",
        ),
    ],
)
def test_each_target_missed_fails_and_is_named(
    gpu_verdict, tmp_path, monkeypatch, capsys, broken, line
):
    code, out = verdict(gpu_verdict, write_run(tmp_path, **broken), monkeypatch, capsys)
    assert code == 1
    assert line in out


def test_a_run_whose_padded_verifications_alone_keep_their_shapes_says_to_pad(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    check = check_json(plain=1.13, padded=1.02)
    code, out = verdict(gpu_verdict, write_run(tmp_path, check=check), monkeypatch, capsys)
    assert code == 0, out
    assert (
        "met      qwen2.5-7b.gguf: a run's decodes within 1.1x of steady, plain or padded: "
        "run: worst 1.13x (n=1); padded_run: worst 1.02x (n=1): met padded only, pad "
        "verifications on this backend" in out
    )


def test_a_run_that_stopped_early_is_not_taken_for_one_that_passed(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    """The device call ran out of time after the kernel's test: what it did not reach is
    missing, and the verdict fails."""
    (tmp_path / "run.log").write_text(run_log())
    code, out = verdict(gpu_verdict, tmp_path, monkeypatch, capsys)
    assert code == 1
    assert "missing  gpu_check.py: every exact row identical, n = 2..32: not run" in out
    assert "missing  bench 1.5b: oracle >= 2.0x, 6/6 identical: not run" in out
    assert (
        "bench 7b-padded" in out and "missing  bench 7b-padded" not in out
    )  # no target of its own


def test_the_verdict_of_a_folder_that_is_not_there_is_a_usage_error(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "argv", ["gpu_verdict.py", str(tmp_path / "absent")])
    assert gpu_verdict.main() == 2
    assert "usage:" in capsys.readouterr().err


def test_a_run_says_how_many_of_its_decodes_reused_their_graphs(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    check = check_json(plain=1.13)
    for found in check.values():
        found["run_graphs_reused"] = "180/184"
    code, out = verdict(gpu_verdict, write_run(tmp_path, check=check), monkeypatch, capsys)
    assert code == 0, out
    assert "run: worst 1.13x (n=1), graphs reused 180/184; padded_run: worst 1.02x (n=1):" in out


def test_a_check_without_the_agreement_with_llama_cpps_kernels_is_not_passed(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    """An invariant but wrong kernel would pass every other check with random weights."""
    check = check_json()
    del check["qwen2.5-7b.gguf:exact"]["agrees_with_fast"]
    code, out = verdict(gpu_verdict, write_run(tmp_path, check=check), monkeypatch, capsys)
    assert code == 1
    agree = "exact logits agree with llama.cpp's kernels: not measured"
    assert f"missing  qwen2.5-7b.gguf: {agree}" in out


def test_greedy_choices_on_the_device_are_information_not_a_target(
    gpu_verdict, tmp_path, monkeypatch, capsys
):
    """Off until a GPU run measures them (device_choices.CHOICES_ON_DEVICE): their costs
    show, and choices other than the host's are named but fail nothing."""
    check = check_json()
    costs = {
        "host_ms": {"1": 3.9, "8": 5.4, "step": 1.3},
        "device_ms": {"1": 3.85, "8": 5.0, "step": 1.17},
    }
    check["qwen2.5-7b.gguf:choices"] = costs | {"same_choices": True}
    check["qwen2.5-1.5b.gguf:choices"] = costs | {"same_choices": False}
    code, out = verdict(gpu_verdict, write_run(tmp_path, check=check), monkeypatch, capsys)
    assert code == 0, out
    measured = "1 row 3.900 -> 3.850 ms (0.99x), 8 rows 5.400 -> 5.000 ms (0.93x), "
    measured += "a drafter's step 1.300 -> 1.170 ms (0.90x)"
    assert f"info     qwen2.5-7b.gguf: greedy choices on the device: {measured}\n" in out
    other = f"qwen2.5-1.5b.gguf: greedy choices on the device: {measured}; OTHER CHOICES"
    assert f"info     {other}" in out


@pytest.mark.parametrize(
    ("choices", "where"),
    [
        ("1 (choice_costs.py found they pay)", "on the GPU: choice_costs.py found they pay"),
        ("0 (set by DEVICE_CHOICES)", "on the host: set by DEVICE_CHOICES"),
        (
            "unset (choice_costs.py found they do not pay)",
            "as device_choices.CHOICES_ON_DEVICE says (on the host for CUDA): "
            "choice_costs.py found they do not pay",
        ),
    ],
)
def test_the_verdict_says_where_the_benches_took_their_greedy_choices(
    gpu_verdict, tmp_path, monkeypatch, capsys, choices, where
):
    folder = write_run(tmp_path, log=run_log(choices=choices))
    code, out = verdict(gpu_verdict, folder, monkeypatch, capsys)
    assert code == 0, out
    assert f"info     greedy choices in the benches: {where}\n" in out
