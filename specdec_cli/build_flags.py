"""Print the CMake flags for building llama-cpp-python safely on this machine.

Runs standalone (no imports from the package): the Makefile calls it before specdec's
dependencies exist. A native x86 build (-march=native) turns on AMX on CPUs that have it,
and llama.cpp's AMX path crashes on the first decode on some of them, so on x86 Linux we
list the instruction sets ourselves and leave AMX off.

On Linux the shared libraries keep the code of static libraries they link to themselves
(--exclude-libs): a toolchain that links libstdc++ statically (seen on a CUDA 13.0 machine)
otherwise gave every llama.cpp library an exported copy of it, the copies stood in for each
other, and every model load crashed in llama_model::print_info.

SPECDEC_CMAKE_ARGS adds to these flags (e.g. "-DGGML_CUDA=on" keeps the AMX guard); it comes
last, so where it sets an option again CMake takes its value. CMAKE_ARGS replaces the computed
flags entirely (SPECDEC_CMAKE_ARGS is still added after it).
"""

from __future__ import annotations

import os
import platform

# /proc/cpuinfo flag -> the ggml option it allows
X86_FEATURES = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
COMMON = (
    "-DLLAVA_BUILD=OFF",  # the multimodal library: not used, a third of the build time
    "-DGGML_RPC=ON",  # llama.cpp's RPC backend: `specdec worker`, --rpc
)
LINUX_LINK = ("-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL",)  # see the docstring


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def x86_args(flags: set[str]) -> list[str]:
    args = ["-DGGML_NATIVE=OFF"]
    args += [
        f"-D{option}={'ON' if feature in flags else 'OFF'}"
        for feature, option in X86_FEATURES.items()
    ]
    args += [f"-D{option}=OFF" for option in ALWAYS_OFF]
    return args


def rowwise_isa(flags: set[str]) -> str:
    """The instruction set of specdec's row-wise kernels (native/rowwise/) in the build these
    flags give: ggml's GGML_AVX512 turns on AVX-512 F/CD/VL/DQ/BW together."""
    if not {"avx2", "fma", "f16c"} <= flags:
        return "none"
    return "avx512_vnni" if {"avx512f", "avx512_vnni"} <= flags else "avx2"


def computed_args(machine: str, system: str, cpuinfo: str) -> list[str]:
    linux = list(LINUX_LINK) if system == "Linux" else []
    if system == "Linux" and machine in ("x86_64", "AMD64"):
        return [*COMMON, *linux, *x86_args(cpu_flags(cpuinfo))]
    return [*COMMON, *linux]  # macOS builds Metal by default; ARM native builds are fine


def cmake_args(environ: dict[str, str], machine: str, system: str, cpuinfo: str) -> str:
    replacement = environ.get("CMAKE_ARGS", "").strip()
    base = [replacement] if replacement else computed_args(machine, system, cpuinfo)
    extra = environ.get("SPECDEC_CMAKE_ARGS", "").strip()
    return " ".join([*base, extra] if extra else base)


def main() -> None:
    cpuinfo = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as handle:
            cpuinfo = handle.read()
    print(cmake_args(dict(os.environ), platform.machine(), platform.system(), cpuinfo))


if __name__ == "__main__":
    main()
