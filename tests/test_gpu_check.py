"""scripts/gpu_check.py on this CPU (no layers offloaded) with a tiny model: exact mode's rows
identical in every batch, and its logits agreeing with llama.cpp's kernels', read as the GPU
run reads them; and a kernel that is invariant but wrong failing the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from project_scripts import load_script


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("gpu_check")


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    """Q4_K and Q6_K products: the kernels real models take."""
    return tiny_models.kquant_target


def run(gpu_check, monkeypatch, capsys, *args: str) -> tuple[int, dict, str]:
    """gpu_check --quick (its timings once each: these tests read the logits) with `args`."""
    for name in ("REPEATS", "WARMUP", "PROMPT_REPEATS"):  # --quick sets them for the process
        monkeypatch.setattr(gpu_check, name, getattr(gpu_check, name))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick", *args])
    code = gpu_check.main()
    out = capsys.readouterr().out
    found = {}
    for line in out.splitlines():
        if line.startswith("{"):  # one per model
            found |= json.loads(line)
    return code, found, out


@pytest.mark.parametrize("exact_only", [False, True])
def test_exact_rows_are_identical_and_agree_with_llama_cpps_kernels(
    gpu_check, model, monkeypatch, capsys, exact_only
):
    args = ["--exact"] * exact_only + ["0", str(model)]
    code, found, out = run(gpu_check, monkeypatch, capsys, *args)
    assert code == 0, out
    assert (f"{model.name}:fast" in found) is not exact_only
    agrees = found[f"{model.name}:exact"]["agrees_with_fast"]
    assert set(agrees) == {"short", "long"}
    for where in agrees.values():
        assert where["least_allowed"] <= gpu_check.AGREEMENT_MIN
        assert where["min_correlation"] >= where["least_allowed"]
        assert where["rows"] == gpu_check.AGREEMENT_ROWS
    assert "exact rows differ: none" in out
    assert "exact logits part from llama.cpp's: none" in out


def test_each_model_is_printed_once_measured(gpu_check, model, monkeypatch, capsys):
    """A run its timeout kills keeps the models it finished (gpu_device.sh joins each line)."""
    check = gpu_check.check

    def killed_at_the_second(path: str, ngl: int, exact: bool):
        if path == "second.gguf":
            raise KeyboardInterrupt  # as the timeout's signal stops it
        return check(path, ngl, exact)

    monkeypatch.setattr(gpu_check, "check", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run(gpu_check, monkeypatch, capsys, "--exact", "0", str(model), "second.gguf")
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    assert [list(found) for found in printed] == [[f"{model.name}:exact"]]


def test_an_invariant_but_wrong_kernel_fails_the_run(gpu_check, model, monkeypatch, capsys):
    """Every exact row shifted one column: the same bits in every batch, other logits."""
    check = gpu_check.check

    def shifted(path: str, ngl: int, exact: bool):
        found, rows = check(path, ngl, exact)
        if exact:
            for found_rows in rows.values():
                found_rows["alone"] = np.roll(found_rows["alone"], 1, axis=1)
        return found, rows

    monkeypatch.setattr(gpu_check, "check", shifted)
    code, found, out = run(gpu_check, monkeypatch, capsys, "0", str(model))
    assert code == 1
    assert "exact rows differ: none" in out
    assert f"exact logits part from llama.cpp's: {model.name}:exact short context" in out
    assert found[f"{model.name}:exact"]["agrees_with_fast"]["long"]["min_correlation"] < 0.5


def test_a_gpu_whose_own_kernels_change_more_with_the_batch_allows_as_much_more(gpu_check):
    """Rows parting from llama.cpp's by a correlation of about 0.8 fail where its own batch
    changes nothing, and pass beside a batch of its own that parts by about 0.9."""
    rng = np.random.default_rng(0)
    alone = rng.normal(size=(8, 4000))

    def parted(by: float) -> np.ndarray:  # correlates with `alone` by about `by`
        return by * alone + np.sqrt(1 - by * by) * rng.normal(size=alone.shape)

    exact = {"short": {"alone": parted(0.8)}}
    for own, fails in ((alone, True), (parted(0.9), False)):
        found = gpu_check.agreement(exact, {"short": {"alone": alone, "batch": own}})
        assert bool(gpu_check.report_agreement("m:exact", found)) is fails
