"""scripts/batch_op_diff.py and the llama package's TensorRecorder on this CPU: the tensors of a
decode read as llama.cpp computes them, and the first one whose token's values depend on the
batch named."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from project_scripts import load_script
from tiny_gguf import TinyConfig

from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.tensors import Recorded, TensorRecorder


@pytest.fixture(scope="module")
def op_diff():
    return load_script("batch_op_diff")


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    """Q4_K and Q6_K products: the kernels real models take."""
    return tiny_models.kquant_target


def recorded(name: str, values: list[float], op: str = "MUL_MAT") -> Recorded:
    return Recorded(name, op, (len(values), 1, 1, 1), np.array(values, dtype=np.float32))


def test_the_first_tensor_computed_that_differs_comes_first(op_diff):
    norm = recorded("attn_norm-0", [1, 2])
    alone = [norm, recorded("Qcur-0", [3, 4]), recorded("l_out-0", [5])]
    batched = [norm, recorded("Qcur-0", [3, 4.5]), recorded("l_out-0", [6])]
    found = op_diff.differing(alone, batched)
    assert [(r.name, diff) for r, diff in found] == [("Qcur-0", 0.5), ("l_out-0", 1.0)]
    assert op_diff.describe(*found[0]) == "Qcur-0 (MUL_MAT, 2): max|diff| 0.5 of values up to 4"


def test_decodes_whose_graphs_part_are_not_compared(op_diff):
    with pytest.raises(SystemExit, match="graphs part at Qcur-0 / Kcur-0"):
        op_diff.differing([recorded("Qcur-0", [1])], [recorded("Kcur-0", [1])])


def test_the_recorder_reads_each_layers_output_as_computed(model):
    """Every layer's output and the logits, in order, with the values of the token decoded:
    another token gives other values from the first layer on."""
    recorder = TensorRecorder(lambda name: name.startswith("l_out-") or name == "result_output")
    backend = LlamaBackend(model, n_ctx=256, exact=True, eval_callback=recorder.callback)
    try:
        runs = []
        for token in (300, 301):
            backend.truncate(0)
            recorder.recorded.clear()
            logits = np.array(backend.decode([token], 1))
            runs.append(list(recorder.recorded))
    finally:
        backend.close()
    names = [r.name for r in runs[0]]
    assert names == [f"l_out-{i}" for i in range(TinyConfig().n_layer)] + ["result_output"]
    np.testing.assert_array_equal(runs[1][-1].first_column, logits[0])
    assert not np.array_equal(runs[0][0].first_column, runs[1][0].first_column)


def test_exact_mode_on_this_cpu_has_no_batch_dependent_operation(
    op_diff, model, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "argv", ["batch_op_diff.py", "0", str(model), "8"])
    assert op_diff.main() == 0
    assert "every layer's output and the logits the same bits" in capsys.readouterr().out
