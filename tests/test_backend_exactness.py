"""Exact mode per backend (llama/exactness.py): one switch for every backend's invariant
kernels, and a refusal where a GPU backend has none. A fake build stands in for llama.cpp's
library, so GPUs that this machine lacks (CUDA, Metal) can be named."""

from __future__ import annotations

import pytest
from project_scripts import load_script

from specdec_cli.errors import BadUsageError, ModelFileError
from specdec_cli.llama import library
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.llama.exactness import Exactness

CPU, GPU = 0, 1  # enum ggml_backend_dev_type


class FakeBuild:
    """A llama.cpp build's functions: its devices (registry name, device type), registries
    compiled in that found no device, and which invariant switches it exports; records every
    switch call."""

    def __init__(
        self, devices: list[tuple[str, int]], switches: set[str], idle: tuple[str, ...] = ()
    ) -> None:
        self.devices = devices
        self.registries = list(dict.fromkeys([name for name, _ in devices] + list(idle)))
        self.switches = switches
        self.calls: list[tuple[str, int]] = []

    def lookup(self, name: str, argtypes: list, restype: object):
        devices, registries = self.devices, self.registries
        functions = {
            "ggml_backend_dev_count": lambda: len(devices),
            "ggml_backend_dev_get": lambda index: index,
            "ggml_backend_dev_type": lambda device: devices[device][1],
            "ggml_backend_dev_backend_reg": lambda device: registries.index(devices[device][0]),
            "ggml_backend_reg_count": lambda: len(registries),
            "ggml_backend_reg_get": lambda index: index,
            "ggml_backend_reg_name": lambda registry: registries[registry].encode(),
            "ggml_backend_reg_dev_count": lambda registry: sum(
                name == registries[registry] for name, _ in devices
            ),
        }
        if name in self.switches:
            return lambda n_rows: self.calls.append((name, n_rows))
        return functions.get(name)


CPU_SWITCH, CUDA_SWITCH = "ggml_cpu_set_invariant_rows", "ggml_backend_cuda_set_invariant_rows"


def test_one_call_sets_every_backends_switch():
    build = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH, CUDA_SWITCH})
    exactness = Exactness(build.lookup)
    exactness.set_invariant_rows(64)
    exactness.set_invariant_rows(0)
    assert sorted(build.calls) == sorted(
        [(CPU_SWITCH, 64), (CUDA_SWITCH, 64), (CPU_SWITCH, 0), (CUDA_SWITCH, 0)]
    )
    assert exactness.gpu_backends == ["CUDA"]
    assert exactness.inexact_gpu_backends() == [] and exactness.missing_in_build() == []
    assert exactness.signature() == "CPU+CUDA"


def test_gpu_backends_without_a_patch_are_named():
    build = FakeBuild([("CPU", CPU), ("Metal", GPU), ("Vulkan", GPU)], {CPU_SWITCH})
    exactness = Exactness(build.lookup)
    assert exactness.inexact_gpu_backends() == ["Metal", "Vulkan"]
    assert exactness.missing_in_build() == []  # no patch exists for them: not a broken build


def test_a_cuda_build_without_its_switch_is_incomplete():
    exactness = Exactness(FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH}).lookup)
    assert exactness.missing_in_build() == ["CUDA"]
    assert exactness.inexact_gpu_backends() == ["CUDA"]


def test_a_gpu_backend_compiled_in_without_a_device_is_named():
    """A CUDA build on a machine whose driver or GPU it cannot see (scripts/check_build.py
    fails there); RPC registers no device by design and is not a GPU backend."""
    build = FakeBuild([("CPU", CPU)], {CPU_SWITCH, CUDA_SWITCH}, idle=("CUDA", "RPC"))
    exactness = Exactness(build.lookup)
    assert exactness.gpu_backends_without_device == ["CUDA"]
    assert exactness.gpu_backends == []
    working = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH, CUDA_SWITCH}, idle=("RPC",))
    assert Exactness(working.lookup).gpu_backends_without_device == []


def test_this_build_has_the_cpu_switch():
    assert library._exactness.on_cpu
    assert "CPU" in library._exactness.signature().split("+")
    assert library.has_invariant_kernels()
    assert "invariant-backends=" in library.kernel_signature(True)


def test_measured_costs_name_the_cuda_product_kernel(monkeypatch):
    """Costs measured with patch 0004's tensor-core products are not reused without them."""
    build = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH, CUDA_SWITCH})
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))
    monkeypatch.delenv("SPECDEC_CUDA_MMV_TC", raising=False)
    plain = library.kernel_signature(True)
    monkeypatch.setenv("SPECDEC_CUDA_MMV_TC", "1")
    assert "cuda-products=mmvq" in plain
    assert library.kernel_signature(True) == plain.replace("=mmvq", "=tensor-cores")
    assert "cuda-products" not in library.kernel_signature(False)
    monkeypatch.setenv("SPECDEC_CUDA_MMV_TC", "0")
    assert library.kernel_signature(True) == plain


def test_measured_costs_and_caches_name_the_cuda_attention_kernel(monkeypatch):
    """Costs and cached states computed with patch 0006's attention kernel are not reused
    without it: its results differ from the vector kernel's in the last bits."""
    build = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH, CUDA_SWITCH})
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))
    monkeypatch.delenv("SPECDEC_CUDA_FATTN_ROWS", raising=False)
    plain = library.kernel_signature(True)
    assert "cuda-attention=vector" in plain
    monkeypatch.setenv("SPECDEC_CUDA_FATTN_ROWS", "1")
    assert library.kernel_signature(True) == plain.replace("=vector", "=rows")
    assert "cuda-attention" not in library.kernel_signature(False)


@pytest.mark.parametrize("variable", ["SPECDEC_CUDA_MMV_TC", "SPECDEC_CUDA_FATTN_ROWS"])
@pytest.mark.parametrize("value", ["yes", "true", " 1", "2"])
def test_a_cuda_kernel_switch_the_library_would_read_otherwise_is_refused(
    monkeypatch, variable, value
):
    """The library takes exactly "1" as on: any other value would key costs by a kernel that
    did not run."""
    build = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH, CUDA_SWITCH})
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))
    monkeypatch.setenv(variable, value)
    with pytest.raises(BadUsageError, match=f"{variable} must be 1"):
        library.kernel_signature(True)


@pytest.fixture
def metal_machine(monkeypatch):
    build = FakeBuild([("CPU", CPU), ("Metal", GPU)], {CPU_SWITCH})
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))


def test_exact_mode_refuses_layers_on_a_gpu_without_invariant_kernels(tiny_models, metal_machine):
    with pytest.raises(ModelFileError, match="Metal") as refused:
        LlamaBackend(tiny_models.target, n_ctx=64, n_gpu_layers=-1, exact=True)
    fix = refused.value.fix or ""
    assert "--fast" in fix and "--gpu-layers 0" in fix


def test_exact_mode_keeps_a_cpu_only_model_on_such_a_machine(tiny_models, metal_machine):
    backend = LlamaBackend(tiny_models.target, n_ctx=64, n_gpu_layers=0, exact=True)
    backend.close()
    fast = LlamaBackend(tiny_models.target, n_ctx=64, n_gpu_layers=-1, exact=False)
    fast.close()


def test_a_build_missing_a_backends_switch_is_refused(tiny_models, monkeypatch):
    build = FakeBuild([("CPU", CPU), ("CUDA", GPU)], {CPU_SWITCH})
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))
    with pytest.raises(ModelFileError, match=r"no batch-invariant kernels \(CUDA\)"):
        LlamaBackend(tiny_models.target, n_ctx=64, exact=True)


def test_the_build_check_fails_where_its_gpu_backend_finds_no_device(monkeypatch):
    """`make install` with CUDA on a machine whose GPU it cannot see ends in one line."""
    check_build = load_script("check_build")
    build = FakeBuild([("CPU", CPU)], {CPU_SWITCH, CUDA_SWITCH}, idle=("CUDA",))
    monkeypatch.setattr(library, "_exactness", Exactness(build.lookup))
    with pytest.raises(SystemExit, match=r"built for CUDA but finds no CUDA device here") as failed:
        check_build.main()
    assert "\n" not in str(failed.value.code) and "make rebuild-llama" in str(failed.value.code)
