"""build_flags: the CMake flags `make install` builds llama.cpp with, per machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from specdec_cli.build_flags import cmake_args, cpu_flags, rowwise_isa

# /proc/cpuinfo excerpts: an AVX-512 server with AMX (the CPUs whose native build crashes),
# and an AVX2 desktop without AVX-512.
AVX512_AMX_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2 avx512f avx512vbmi \
avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8 amx_bf16
"""
AVX2_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2
"""
ARM_CPUINFO = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimddp
"""


def options(args: str) -> dict[str, str]:
    """'-DA=ON -DB=OFF' -> {'A': 'ON', 'B': 'OFF'}; CMake keeps the last value of an option."""
    result = {}
    for arg in args.split():
        name, _, value = arg.removeprefix("-D").partition("=")
        result[name] = value
    return result


def x86(cpuinfo: str, **environ: str) -> dict[str, str]:
    return options(cmake_args(environ, "x86_64", "Linux", cpuinfo))


def test_x86_with_avx512_turns_it_on_and_amx_off() -> None:
    flags = x86(AVX512_AMX_CPUINFO)
    assert flags["GGML_NATIVE"] == "OFF"
    for option in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"):
        assert flags[option] == "ON"
    for option in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert flags[option] == "ON"
    assert flags["GGML_AVX_VNNI"] == "ON"
    # The CPU has AMX, and AMX is exactly what stays off.
    for option in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert flags[option] == "OFF"
    assert flags["LLAVA_BUILD"] == "OFF"
    assert flags["GGML_RPC"] == "ON"  # `specdec worker` and --rpc


def test_x86_without_avx512_leaves_it_off() -> None:
    flags = x86(AVX2_CPUINFO)
    assert flags["GGML_AVX2"] == "ON" and flags["GGML_FMA"] == "ON"
    for option in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert flags[option] == "OFF"
    assert flags["GGML_AVX_VNNI"] == "OFF"
    assert flags["GGML_AMX_TILE"] == "OFF"


def test_x86_without_a_flags_line_asks_for_no_instruction_set() -> None:
    flags = x86("")
    assert flags["GGML_NATIVE"] == "OFF"
    assert flags["GGML_AVX"] == "OFF" and flags["GGML_AVX2"] == "OFF"


def test_arm_linux_and_macos_keep_llama_cpps_native_build() -> None:
    for machine, system, cpuinfo in (
        ("aarch64", "Linux", ARM_CPUINFO),
        ("arm64", "Darwin", ""),
        ("x86_64", "Darwin", ""),  # an Intel Mac: no /proc/cpuinfo, llama.cpp's own choice
    ):
        expected = "-DLLAVA_BUILD=OFF -DGGML_RPC=ON"
        if system == "Linux":
            expected += " -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL"
        assert cmake_args({}, machine, system, cpuinfo) == expected, (machine, system)


def test_specdec_cmake_args_adds_to_the_computed_flags() -> None:
    flags = x86(AVX512_AMX_CPUINFO, SPECDEC_CMAKE_ARGS=" -DGGML_CUDA=on ")
    assert flags["GGML_CUDA"] == "on"
    assert flags["GGML_AMX_TILE"] == "OFF" and flags["LLAVA_BUILD"] == "OFF"
    assert flags["GGML_AVX512"] == "ON"
    mac = cmake_args({"SPECDEC_CMAKE_ARGS": "-DGGML_METAL=off"}, "arm64", "Darwin", "")
    assert mac == "-DLLAVA_BUILD=OFF -DGGML_RPC=ON -DGGML_METAL=off"


def test_specdec_cmake_args_comes_last_so_it_can_override_an_option() -> None:
    assert x86(AVX512_AMX_CPUINFO, SPECDEC_CMAKE_ARGS="-DGGML_AVX512=OFF")["GGML_AVX512"] == "OFF"


def test_cmake_args_replaces_the_computed_flags() -> None:
    assert x86(AVX512_AMX_CPUINFO, CMAKE_ARGS="-DGGML_NATIVE=ON") == {"GGML_NATIVE": "ON"}
    both = cmake_args(
        {"CMAKE_ARGS": "-DGGML_NATIVE=ON", "SPECDEC_CMAKE_ARGS": "-DGGML_CUDA=on"},
        "x86_64",
        "Linux",
        AVX512_AMX_CPUINFO,
    )
    assert both == "-DGGML_NATIVE=ON -DGGML_CUDA=on"
    assert x86(AVX2_CPUINFO, CMAKE_ARGS="  ") == x86(AVX2_CPUINFO)  # blank: not set


def test_runs_as_a_script_without_the_package(tmp_path: Path) -> None:
    """The Makefile runs it before specdec is installed: by path, from anywhere."""
    script = Path(__file__).resolve().parents[1] / "specdec_cli" / "build_flags.py"
    environ = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "PYTHONPATH")}
    environ["SPECDEC_CMAKE_ARGS"] = "-DGGML_CUDA=on"
    printed = subprocess.run(
        [sys.executable, "-I", "-S", str(script)],  # -S: no site-packages, so no specdec
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed.startswith("-DLLAVA_BUILD=OFF") and printed.endswith("-DGGML_CUDA=on")


def test_the_rowwise_kernels_follow_the_instruction_sets_the_build_turns_on():
    assert rowwise_isa(cpu_flags(AVX512_AMX_CPUINFO)) == "avx512_vnni"
    assert rowwise_isa(cpu_flags(AVX2_CPUINFO)) == "avx2"
    assert rowwise_isa({"avx2", "fma", "f16c", "avx512f"}) == "avx2"  # AVX-512 without VNNI
    assert rowwise_isa({"sse4_2", "avx"}) == "none"


def test_linux_libraries_keep_the_static_code_they_link_to_themselves() -> None:
    # A toolchain that links libstdc++ statically gave every library an exported copy, which
    # stood in for the others' and crashed every model load (seen with CUDA 13.0).
    for machine, cpuinfo in (("x86_64", AVX2_CPUINFO), ("aarch64", ARM_CPUINFO)):
        flags = options(cmake_args({}, machine, "Linux", cpuinfo))
        assert flags["CMAKE_SHARED_LINKER_FLAGS"] == "-Wl,--exclude-libs,ALL"
    assert "CMAKE_SHARED_LINKER_FLAGS" not in options(cmake_args({}, "arm64", "Darwin", ""))
